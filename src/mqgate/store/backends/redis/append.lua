--! include common.lua
-- Append batches to queues of one topic and wake long-polling readers everywhere.
-- KEYS[1] = meta hash; KEYS[1 + i] = stream of the i-th batch's queue
-- ARGV[1] = wake channel, ARGV[2] = wake payload (the writing store's id),
-- ARGV[3] = least microseconds between two wake publishes of this topic,
-- then per batch: queue, message count n, and n pairs (timestamp ms, stored JSON).
-- Returns {1 if a wake was published else 0, first offset of each batch in order...}.
-- Errors (nothing written): 'MQGATE no_topic', 'MQGATE no_queue <q>'.
local meta = KEYS[1]
local queues = tonumber(redis.call('HGET', meta, 'queues'))
if not queues then
  return redis.error_reply('MQGATE no_topic')
end
-- Check every batch first: a script that fails halfway is not rolled back.
local a = 4
for _ = 2, #KEYS do
  local q = tonumber(ARGV[a])
  if q == nil or q < 0 or q >= queues or q % 1 ~= 0 then
    return redis.error_reply('MQGATE no_queue ' .. ARGV[a])
  end
  a = a + 2 + 2 * tonumber(ARGV[a + 1])
end
local firsts = {0}  -- [1] = published, set below
a = 4
for k = 2, #KEYS do
  local q, n, stream = ARGV[a], tonumber(ARGV[a + 1]), KEYS[k]
  local first = redis.call('HINCRBY', meta, 'max:' .. q, n) - n
  local bytes = 0
  a = a + 2
  for i = 0, n - 1 do
    local d = ARGV[a + 1]
    redis.call('XADD', stream, entry_id(first + i), 't', ARGV[a], 'd', d)
    bytes = bytes + #d
    a = a + 2
  end
  redis.call('HINCRBY', meta, 'bytes:' .. q, int(bytes))
  firsts[#firsts + 1] = first
end
-- At most one publish per interval and topic (a clock step back publishes at once). A
-- caller told 0 publishes later itself, so every append is followed by a publish.
local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.call('HGET', meta, 'woke')) or 0
local published = 0
if now_us - last >= tonumber(ARGV[3]) or now_us < last then
  redis.call('HSET', meta, 'woke', int(now_us))
  redis.call('PUBLISH', ARGV[1], ARGV[2])
  published = 1
end
firsts[1] = published
return firsts
