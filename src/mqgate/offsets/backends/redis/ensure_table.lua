--! include common.lua
-- Create the table if absent (1), else grow it to #starts queues (0). See README.md.
-- KEYS[1] table hash, KEYS[2] clients zset
-- ARGV[1] broker, ARGV[2] client id, ARGV[3] now ms, ARGV[4..] start offset of each queue
local prefix = ARGV[1] .. ':'
local wanted = #ARGV - 3
local n = redis.call('HGET', KEYS[1], 'n')
local from = 0
if n then
  from = tonumber(n)
  if from >= wanted then return 0 end
end
local kv = {'n', wanted}
for q = from, wanted - 1 do
  kv[#kv + 1] = prefix .. q .. ':committed'
  kv[#kv + 1] = ARGV[4 + q]
end
hset(KEYS[1], kv)
if n then return 0 end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
return 1
