--! include common.lua
--! include lease_queue.lua
-- Choose a queue (SPEC G4, with lanes), lock it and record the delivery. See README.md.
-- KEYS[1] table hash, KEYS[2] clients zset
-- ARGV: now ms, max count, lock timeout ms, max attempts, owner, client id, broker, then min,
-- max, lane for queue 0, 1, ... Returns as lease_queue.
return lease_queue(KEYS[1], KEYS[2], ARGV, 0)
