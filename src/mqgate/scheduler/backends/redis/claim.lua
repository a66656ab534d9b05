--! include common.lua
-- Claim due destinations (move-when-due). KEYS: see common.lua.
-- ARGV[1] now ms, ARGV[2] limit, ARGV[3] claim deadline ms, ARGV[4] move cap
-- First moves expired claims and due members (start <= now) to the ready set, at most
-- `move cap` of each. If either hit the cap, returns {1} and claims nothing: the caller calls
-- again, so that the claim below sees every due member and its priority order is exact.
-- Otherwise claims up to `limit` members of the ready set, best rank first, and returns
-- {0, member, payload, destination msgpack, times claimed, member, ...}.
local now, limit, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])

local expired = redis.call('ZRANGEBYSCORE', KEYS[CLAIMS], '-inf', now, 'LIMIT', 0, cap)
for _, mem in ipairs(expired) do
  redis.call('ZREM', KEYS[CLAIMS], mem)
  local raw = redis.call('HGET', KEYS[DST], mem)
  if raw then redis.call('ZADD', KEYS[READY], rank(raw), mem) end
end
local due = redis.call('ZRANGEBYSCORE', KEYS[DUE], '-inf', now, 'LIMIT', 0, cap)
for _, mem in ipairs(due) do
  redis.call('ZREM', KEYS[DUE], mem)
  local raw = redis.call('HGET', KEYS[DST], mem)
  if raw then redis.call('ZADD', KEYS[READY], rank(raw), mem) end
end
if #expired == cap or #due == cap then return {1} end

local out = {0}
if limit <= 0 then return out end
local take = redis.call('ZRANGE', KEYS[READY], 0, limit - 1)
for _, mem in ipairs(take) do
  redis.call('ZREM', KEYS[READY], mem)
  redis.call('ZADD', KEYS[CLAIMS], ARGV[3], mem)
  local tries = redis.call('HINCRBY', KEYS[TRIES], mem, 1)
  local payload = redis.call('HGET', KEYS[MSG], seq_of(mem))
  local raw = redis.call('HGET', KEYS[DST], mem)
  out[#out + 1] = mem
  out[#out + 1] = payload
  out[#out + 1] = raw
  out[#out + 1] = tries
end
return out
