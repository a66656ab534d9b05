--! include common.lua
--! include settle_batch.lua
-- Ack, dead-letter, release or extend the batch an ack token names (SPEC G5). See README.md.
-- KEYS[1] table hash, KEYS[2] clients zset
-- ARGV: op, broker, queue, token offset, token lock ts, now ms, next offset or new deadline ms,
-- dead-lettered count, client id. Returns as settle_batch.
return settle_batch(KEYS[1], KEYS[2], ARGV, 0)
