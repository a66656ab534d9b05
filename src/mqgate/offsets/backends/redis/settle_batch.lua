-- Shared by settle.lua and ack_lease.lua (pasted in front by `--! include settle_batch.lua`).

-- Ack, dead-letter, release or extend the batch an ack token names (SPEC G5). See README.md.
-- table_key: the table hash, clients_key: the clients zset; from args[at + 1]:
-- op: 'commit' | 'dead' (a commit by the gateway, not an ack) | 'count' (dead letters of a batch
-- delivered otherwise: no commit) | 'release' | 'extend', broker, queue, token offset, token lock
-- ts, now ms, next offset (commit) or new deadline ms (extend), dead-lettered count (commit,
-- count), client id.
-- Returns -1 (no table), nil (done) or the refusal: already_acked, offset_moved, lock_expired,
-- lock_taken. An ack remembers its lock ts ('acked'), so a retried ack is told apart.
local function settle_batch(table_key, clients_key, args, at)
  if redis.call('EXISTS', table_key) == 0 then return -1 end
  local f = args[at + 2] .. ':' .. args[at + 3] .. ':'
  local v = redis.call('HMGET', table_key, f .. 'committed', f .. 'lock_ts', f .. 'lock_deadline', f .. 'acked')
  if not v[1] then return 'offset_moved' end  -- no such queue
  local now = tonumber(args[at + 6])
  local refusal = ack_refusal(
    tonumber(v[1]), num(v[2]), num(v[3]), num(v[4]), tonumber(args[at + 4]), tonumber(args[at + 5]), now)
  if refusal then return refusal end

  local op = args[at + 1]
  if op == 'extend' then
    redis.call('HSET', table_key, f .. 'lock_deadline', args[at + 7])
  elseif op == 'count' then
    redis.call('HINCRBY', table_key, f .. 'dead', args[at + 8])
  elseif op == 'release' then
    -- lock_ts stays: the next lock must get a larger one, so an old token never matches it.
    redis.call('HSET', table_key, f .. 'lock_deadline', 0, f .. 'owner', '')
  else
    redis.call('HSET', table_key,
      f .. 'committed', args[at + 7],
      f .. 'lock_deadline', 0,
      f .. 'owner', '',
      f .. 'attempts', 0,
      f .. 'delivered_end', 0,
      f .. 'access', now)
    if op == 'commit' then redis.call('HSET', table_key, f .. 'acked', args[at + 5]) end
    redis.call('HINCRBY', table_key, f .. 'dead', args[at + 8])
    redis.call('ZADD', clients_key, 'GT', now, args[at + 9])
  end
  return nil
end
