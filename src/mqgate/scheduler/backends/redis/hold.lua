--! include common.lua
-- Hold messages. KEYS: see common.lua.
-- ARGV[1] wake channel, ARGV[2] message count n, ARGV[3] now ms, ARGV[4] keep keys until ms,
-- then per message: hold key ('' = none), payload, destination count k, then k times:
-- destination msgpack, deliver_at_ms, target.
-- A message whose key is already kept is not held again (its hold may have answered an error
-- after it was written, e.g. a replica wait that timed out: the caller tries again); the key's
-- keep-until only moves later. A new key is kept until ARGV[4]. Up to 100 keys whose time ran
-- out (keep-until < now) go first.
-- Returns {first seq, then per message held before: its index (0-based) and its seq}; the
-- messages get first .. first + n - 1 in order, each one held before keeps its old seq instead.
local n, now, keep_until = tonumber(ARGV[2]), ARGV[3], ARGV[4]
local stale = redis.call('ZRANGEBYSCORE', KEYS[ONCE_UNTIL], '-inf', '(' .. now, 'LIMIT', 0, 100)
for _, key in ipairs(stale) do
  redis.call('ZREM', KEYS[ONCE_UNTIL], key)
  redis.call('HDEL', KEYS[ONCE], key)
end
local first = redis.call('INCRBY', KEYS[SEQ], n) - n + 1
local current = redis.call('ZRANGE', KEYS[DUE], 0, 0, 'WITHSCORES')
local earliest = nil
local out = {first}
local i = 5
for m = 0, n - 1 do
  local key, k = ARGV[i], tonumber(ARGV[i + 2])
  local before = key ~= '' and redis.call('HGET', KEYS[ONCE], key)
  if before then
    redis.call('ZADD', KEYS[ONCE_UNTIL], 'GT', keep_until, key)
    out[#out + 1] = m
    out[#out + 1] = tonumber(before)
    i = i + 3 + 3 * k
  else
    local seq = string.format('%d', first + m)
    if key ~= '' then
      redis.call('HSET', KEYS[ONCE], key, seq)
      redis.call('ZADD', KEYS[ONCE_UNTIL], keep_until, key)
    end
    redis.call('HSET', KEYS[MSG], seq, ARGV[i + 1])
    redis.call('HSET', KEYS[LEFT], seq, k)
    i = i + 3
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
end
wake_if_sooner(ARGV[1], earliest, current)
return out
