-- Create a topic, or grow it to more queues, and set its retention.
-- KEYS[1] = meta hash of the topic
-- ARGV[1] = queue count, ARGV[2] = retention_ms, ARGV[3] = retention_bytes ('' = unlimited)
-- Returns {queues before (0 = it did not exist), queues now}. Asking for fewer queues than
-- the topic has changes nothing (the caller refuses it).
local meta = KEYS[1]
local want = tonumber(ARGV[1])
local had = tonumber(redis.call('HGET', meta, 'queues')) or 0
if want < had then
  return {had, had}
end
-- Queue fields before the count, so a reader that sees the count always finds them.
for q = had, want - 1 do
  redis.call('HSETNX', meta, 'max:' .. q, 0)
  redis.call('HSETNX', meta, 'min:' .. q, 0)
  redis.call('HSETNX', meta, 'bytes:' .. q, 0)
end
if want > had then
  redis.call('HSET', meta, 'queues', want)
end
redis.call('HSET', meta, 'retention_ms', ARGV[2])
if ARGV[3] == '' then
  redis.call('HDEL', meta, 'retention_bytes')
else
  redis.call('HSET', meta, 'retention_bytes', ARGV[3])
end
return {had, want}
