-- Raise committed offsets, never lower them (a Spark job's progress). See README.md.
-- KEYS[1] table hash; KEYS[2], KEYS[3] (optional) the receipts hash and visibility zset
-- ARGV[1] broker, then pairs: ARGV[2k] queue, ARGV[2k+1] offset
-- Returns -1 (no table), -2 (a queue outside 0..n-1; nothing written) or the committed
-- offsets after the step, in the order of the pairs.
local n = redis.call('HGET', KEYS[1], 'n')
if not n then return -1 end
n = tonumber(n)
for i = 2, #ARGV, 2 do
  local q = tonumber(ARGV[i])
  if q < 0 or q >= n then return -2 end
end
local out = {}
for i = 2, #ARGV, 2 do
  local f = ARGV[1] .. ':' .. ARGV[i] .. ':'
  local want = tonumber(ARGV[i + 1])
  local have = tonumber(redis.call('HGET', KEYS[1], f .. 'committed') or '0')
  if want > have then
    if #KEYS >= 3 then  -- a message-level consumer's receipts go with the old position
      local q = ARGV[i]
      local e = tonumber(redis.call('HGET', KEYS[2], q .. ':end') or '0')
      for o = have, e - 1 do
        redis.call('HDEL', KEYS[2], q .. ':' .. o)
        redis.call('ZREM', KEYS[3], q .. ':' .. o)
      end
      redis.call('HDEL', KEYS[2], q .. ':end')
    end
    redis.call('HSET', KEYS[1], f .. 'committed', ARGV[i + 1], f .. 'attempts', 0, f .. 'delivered_end', 0)
    have = want
  end
  out[#out + 1] = have
end
return out
