--! include common.lua
-- Forget hold keys: a hold under one of them again holds anew. KEYS: see common.lua.
-- ARGV: the keys. Returns how many were kept.
local gone = 0
for _, key in ipairs(ARGV) do
  gone = gone + redis.call('HDEL', KEYS[ONCE], key)
  redis.call('ZREM', KEYS[ONCE_UNTIL], key)
end
return gone
