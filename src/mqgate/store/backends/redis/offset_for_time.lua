--! include common.lua
-- The first offset of a queue whose message is at or after a time, or the queue's max.
-- KEYS[1] = meta hash, KEYS[2] = stream of the queue; ARGV[1] = queue, ARGV[2] = time ms
-- Errors: 'MQGATE no_topic', 'MQGATE no_queue <q>'.
local r = redis.call('HMGET', KEYS[1], 'queues', 'min:' .. ARGV[1], 'max:' .. ARGV[1])
if not r[1] then
  return redis.error_reply('MQGATE no_topic')
end
if not r[2] or tonumber(ARGV[1]) >= tonumber(r[1]) then
  return redis.error_reply('MQGATE no_queue ' .. ARGV[1])
end
return first_at_or_after(KEYS[2], tonumber(r[2]), tonumber(r[3]), tonumber(ARGV[2]))
