--! include common.lua
-- Remove delivered or expired destinations; delete a message once none is left (SPEC S5).
-- KEYS: see common.lua. ARGV: seq, index, seq, index, ...
-- Unknown or already settled pairs are ignored. Returns how many destinations were removed.
local removed = 0
for i = 1, #ARGV, 2 do
  local seq = ARGV[i]
  local mem = member(tonumber(seq), tonumber(ARGV[i + 1]))
  local raw = redis.call('HGET', KEYS[DST], mem)
  if raw then
    redis.call('HDEL', KEYS[DST], mem)
    local target = cmsgpack.unpack(raw)[1]
    if redis.call('HINCRBY', KEYS[TARGETS], target, -1) <= 0 then
      redis.call('HDEL', KEYS[TARGETS], target)  -- 0, or below for what was held before counting
    end
    removed = removed + 1
    redis.call('ZREM', KEYS[DUE], mem)
    redis.call('ZREM', KEYS[READY], mem)
    redis.call('ZREM', KEYS[CLAIMS], mem)
    redis.call('HDEL', KEYS[TRIES], mem)
    if redis.call('HINCRBY', KEYS[LEFT], seq, -1) <= 0 then
      redis.call('HDEL', KEYS[LEFT], seq)
      redis.call('HDEL', KEYS[MSG], seq)
    end
  end
end
return removed
