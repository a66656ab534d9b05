--! include common.lua
-- Hold messages. KEYS: see common.lua.
-- ARGV[1] wake channel, ARGV[2] message count n, then per message:
--   payload, destination count k, then k times: destination msgpack, deliver_at_ms, target
-- Returns the first seq; the messages get first .. first + n - 1, in order.
local n = tonumber(ARGV[2])
local first = redis.call('INCRBY', KEYS[SEQ], n) - n + 1
local current = redis.call('ZRANGE', KEYS[DUE], 0, 0, 'WITHSCORES')
local earliest = nil
local i = 3
for m = 0, n - 1 do
  local seq = string.format('%d', first + m)
  local k = tonumber(ARGV[i + 1])
  redis.call('HSET', KEYS[MSG], seq, ARGV[i])
  redis.call('HSET', KEYS[LEFT], seq, k)
  i = i + 2
  for j = 0, k - 1 do
    local mem = member(first + m, j)
    redis.call('HSET', KEYS[DST], mem, ARGV[i])
    redis.call('ZADD', KEYS[DUE], ARGV[i + 1], mem)
    redis.call('HINCRBY', KEYS[TARGETS], ARGV[i + 2], 1)
    local at = tonumber(ARGV[i + 1])
    if not earliest or at < earliest then earliest = at end
    i = i + 3
  end
end
wake_if_sooner(ARGV[1], earliest, current)
return first
