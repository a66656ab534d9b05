-- Set a queue's committed offset; drop its lock and attempt count. See README.md.
-- KEYS[1] table hash; KEYS[2], KEYS[3] (optional) the receipts hash and visibility zset
-- ARGV[1] broker, ARGV[2] queue, ARGV[3] offset
-- Returns -1 (no table), -2 (no such queue) or 1.
local n = redis.call('HGET', KEYS[1], 'n')
if not n then return -1 end
local q = tonumber(ARGV[2])
if q < 0 or q >= tonumber(n) then return -2 end
local f = ARGV[1] .. ':' .. ARGV[2] .. ':'
-- A message-level consumer's receipts of the queue (KEYS[2] receipts hash, KEYS[3] visibility
-- zset): they live in [committed, end) only, and go with the old position.
if #KEYS >= 3 then
  local c = tonumber(redis.call('HGET', KEYS[1], f .. 'committed') or '0')
  local e = tonumber(redis.call('HGET', KEYS[2], q .. ':end') or '0')
  for o = c, e - 1 do
    local member = string.format('%d:%d', q, o)
    redis.call('HDEL', KEYS[2], member)
    redis.call('ZREM', KEYS[3], member)
  end
  redis.call('HDEL', KEYS[2], q .. ':end')
end
redis.call('HSET', KEYS[1],
  f .. 'committed', ARGV[3],
  f .. 'lock_deadline', 0,
  f .. 'owner', '',
  f .. 'attempts', 0,
  f .. 'delivered_end', 0)
return 1
