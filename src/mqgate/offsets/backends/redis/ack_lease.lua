--! include common.lua
--! include settle_batch.lua
--! include lease_queue.lua
-- A pull that carries the ack of its previous batch: the ack, then the lease, in one call.
-- KEYS[1] table hash, KEYS[2] clients zset (the ack's table is the lease's)
-- ARGV[1..9] settle_batch's (op 'commit'), ARGV[10..] lease_queue's.
-- Returns -1 (no table) or {the ack's refusal or false, the lease's answer or false}: the lease
-- runs whatever the ack answered, as a pull's does.
local acked = settle_batch(KEYS[1], KEYS[2], ARGV, 0)
if acked == -1 then return -1 end
local leased = lease_queue(KEYS[1], KEYS[2], ARGV, 9)
return {acked or false, leased or false}
