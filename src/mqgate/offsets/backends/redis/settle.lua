--! include common.lua
-- Ack, dead-letter, release or extend the batch an ack token names (SPEC G5). See README.md.
-- KEYS[1] table hash, KEYS[2] clients zset
-- ARGV[1] op: 'commit' | 'dead' (a commit by the gateway, not an ack) | 'count' (dead letters
-- of a batch delivered otherwise: no commit) | 'release' | 'extend', ARGV[2] broker, ARGV[3] queue,
-- ARGV[4] token offset, ARGV[5] token lock ts, ARGV[6] now ms,
-- ARGV[7] next offset (commit) or new deadline ms (extend), ARGV[8] dead-lettered count (commit, count),
-- ARGV[9] client id
-- Returns -1 (no table), nil (done) or the refusal: already_acked, offset_moved, lock_expired,
-- lock_taken. An ack remembers its lock ts ('acked'), so a retried ack is told apart.
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local f = ARGV[2] .. ':' .. ARGV[3] .. ':'
local v = redis.call('HMGET', KEYS[1], f .. 'committed', f .. 'lock_ts', f .. 'lock_deadline', f .. 'acked')
if not v[1] then return 'offset_moved' end  -- no such queue
local now = tonumber(ARGV[6])
local refusal = ack_refusal(tonumber(v[1]), num(v[2]), num(v[3]), num(v[4]), tonumber(ARGV[4]), tonumber(ARGV[5]), now)
if refusal then return refusal end

local op = ARGV[1]
if op == 'extend' then
  redis.call('HSET', KEYS[1], f .. 'lock_deadline', ARGV[7])
elseif op == 'count' then
  redis.call('HINCRBY', KEYS[1], f .. 'dead', ARGV[8])
elseif op == 'release' then
  -- lock_ts stays: the next lock must get a larger one, so an old token never matches it.
  redis.call('HSET', KEYS[1], f .. 'lock_deadline', 0, f .. 'owner', '')
else
  redis.call('HSET', KEYS[1],
    f .. 'committed', ARGV[7],
    f .. 'lock_deadline', 0,
    f .. 'owner', '',
    f .. 'attempts', 0,
    f .. 'delivered_end', 0,
    f .. 'access', now)
  if op == 'commit' then redis.call('HSET', KEYS[1], f .. 'acked', ARGV[5]) end
  redis.call('HINCRBY', KEYS[1], f .. 'dead', ARGV[8])
  redis.call('ZADD', KEYS[2], 'GT', now, ARGV[9])
end
return nil
