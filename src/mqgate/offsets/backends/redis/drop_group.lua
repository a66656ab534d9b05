-- Delete a group's tables and rate bucket. See README.md. Used when a consumer is deleted.
-- KEYS[1] clients zset, KEYS[2] rate hash, KEYS[3..] table hashes, then any other keys of the
-- group to delete (a message-level consumer's receipts and visibility zset)
-- ARGV[1..] the client ids of KEYS[3..] (same order)
-- Only the listed tables go, with their clients-zset members: a table created since the
-- caller's read stays, still listed.
for i = 1, #ARGV do
  redis.call('DEL', KEYS[i + 2])
  redis.call('ZREM', KEYS[1], ARGV[i])
end
redis.call('DEL', KEYS[2])
for i = #ARGV + 3, #KEYS do  -- a message-level consumer's receipts and visibility zset
  redis.call('DEL', KEYS[i])
end
return #ARGV
