-- The group's token bucket, shared by every gateway (mqgate.core.ratelimit, same math).
-- KEYS[1] rate hash {tokens, updated_ms, rate}
-- ARGV[1] op: 'take' | 'return', ARGV[2] rate per s, ARGV[3] wanted (take) or count (return),
-- ARGV[4] now ms (take)
-- take returns {granted, retry_after_s as a string}; return returns 1 if tokens went back.
local rate = tonumber(ARGV[2])
local capacity = math.max(rate, 1)
local b = redis.call('HMGET', KEYS[1], 'tokens', 'updated_ms', 'rate')
local same = b[3] and tonumber(b[3]) == rate

if ARGV[1] == 'return' then
  if not same then return 0 end
  local tokens = math.min(capacity, tonumber(b[1]) + tonumber(ARGV[3]))
  redis.call('HSET', KEYS[1], 'tokens', tokens)
  return 1
end

local now = tonumber(ARGV[4])
local tokens, updated = capacity, now
if same then tokens, updated = tonumber(b[1]), tonumber(b[2]) end
-- Gateways' clocks differ a little: time never runs backwards for the bucket, or a late
-- caller would drain it and the next would count the same interval twice.
if now > updated then
  tokens = math.min(capacity, tokens + (now - updated) * rate / 1000)
  updated = now
else
  tokens = math.min(capacity, tokens)
end
local granted = math.max(math.min(tonumber(ARGV[3]), math.floor(tokens)), 0)
tokens = tokens - granted
redis.call('HSET', KEYS[1], 'tokens', tokens, 'updated_ms', updated, 'rate', ARGV[2])
local retry = 0
if granted == 0 then
  if rate > 0 then retry = math.max((1 - tokens) / rate, 0.001) else retry = 1 end
end
return {granted, string.format('%.17g', retry)}
