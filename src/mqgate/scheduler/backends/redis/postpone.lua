--! include common.lua
-- Move destinations to a new start time and drop their claims (a failed delivery retried
-- later, SPEC S5); the times-claimed count is kept. KEYS: see common.lua.
-- ARGV[1] wake channel, then seq, index, deliver_at_ms, seq, index, deliver_at_ms, ...
-- Unknown or settled pairs are ignored. Returns how many destinations were moved.
local current = redis.call('ZRANGE', KEYS[DUE], 0, 0, 'WITHSCORES')
local earliest = nil
local moved = 0
for i = 2, #ARGV, 3 do
  local mem = member(tonumber(ARGV[i]), tonumber(ARGV[i + 1]))
  local raw = redis.call('HGET', KEYS[DST], mem)
  if raw then
    local at = tonumber(ARGV[i + 2])
    local d = cmsgpack.unpack(raw)
    d[2] = at
    redis.call('HSET', KEYS[DST], mem, cmsgpack.pack(d))
    redis.call('ZREM', KEYS[READY], mem)
    redis.call('ZREM', KEYS[CLAIMS], mem)
    redis.call('ZADD', KEYS[DUE], ARGV[i + 2], mem)
    if not earliest or at < earliest then earliest = at end
    moved = moved + 1
  end
end
wake_if_sooner(ARGV[1], earliest, current)
return moved
