-- Set a queue's committed offset; drop its lock and attempt count. See README.md.
-- KEYS[1] table hash
-- ARGV[1] broker, ARGV[2] queue, ARGV[3] offset
-- Returns -1 (no table), -2 (no such queue) or 1.
local n = redis.call('HGET', KEYS[1], 'n')
if not n then return -1 end
local q = tonumber(ARGV[2])
if q < 0 or q >= tonumber(n) then return -2 end
local f = ARGV[1] .. ':' .. ARGV[2] .. ':'
redis.call('HSET', KEYS[1],
  f .. 'committed', ARGV[3],
  f .. 'lock_deadline', 0,
  f .. 'owner', '',
  f .. 'attempts', 0,
  f .. 'delivered_end', 0)
return 1
