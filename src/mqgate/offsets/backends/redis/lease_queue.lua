-- Shared by lease.lua and ack_lease.lua (pasted in front by `--! include lease_queue.lua`).

-- Choose a queue (SPEC G4, with lanes), lock it and record the delivery. See README.md.
-- table_key: the table hash, clients_key: the clients zset; from args[at + 1]: now ms, max count,
-- lock timeout ms, max attempts, owner, client id, broker, then min, max, lane for queue 0, 1, ...
-- (to the end of args). Returns -1 (no table), {-2, queues in table} (bounds do not match the
-- table), nil (no queue free) or {queue, offset, next offset, lock ts, attempts, dead letter 0/1,
-- first lock ts}: the last is the lock ts of the batch's first delivery, the same on each
-- redelivery of the batch.
local function lease_queue(table_key, clients_key, args, at)
  local now = tonumber(args[at + 1])
  local n = redis.call('HGET', table_key, 'n')
  if not n then return -1 end
  n = tonumber(n)
  redis.call('ZADD', clients_key, 'GT', now, args[at + 6])
  if #args - at ~= 7 + 3 * n then return {-2, n} end

  local prefix = args[at + 7] .. ':'
  -- The choice reads 3 fields per queue; the chosen one's lock_ts comes with its other fields.
  -- Skipping lock_ts here is exact: a deadline > 0 is only ever set with a lock_ts >= 1, so for
  -- now >= 0 "lock_ts ~= 0 and deadline > now" is "deadline > now".
  local fields = {}
  for q = 0, n - 1 do
    local f = prefix .. q .. ':'
    fields[3 * q + 1] = f .. 'committed'
    fields[3 * q + 2] = f .. 'lock_deadline'
    fields[3 * q + 3] = f .. 'access'
  end
  local v = hmget(table_key, fields)

  -- Sort key (-lane, -backlog, last access, queue): queues are scanned in id order, so on a
  -- full tie the first one seen stays.
  local tonumber, max = tonumber, math.max
  local best, best_lane, best_backlog, best_access, best_committed, best_min, best_max
  for q = 0, n - 1 do
    local a = at + 7 + 3 * q
    local qmin, qmax, lane = tonumber(args[a + 1]), tonumber(args[a + 2]), tonumber(args[a + 3])
    local committed = tonumber(v[3 * q + 1])
    local backlog = qmax - max(committed, qmin)
    local deadline = tonumber(v[3 * q + 2]) or 0
    local held = deadline > now
      and (now >= 0 or lock_is_held(num(redis.call('HGET', table_key, prefix .. q .. ':lock_ts')), deadline, now))
    if backlog > 0 and not held then
      local access = tonumber(v[3 * q + 3]) or 0
      if best == nil or lane > best_lane or (lane == best_lane and (backlog > best_backlog
          or (backlog == best_backlog and access < best_access))) then
        best, best_lane, best_backlog, best_access = q, lane, backlog, access
        best_committed, best_min, best_max = committed, qmin, qmax
      end
    end
  end
  if best == nil then return nil end

  local f = prefix .. best .. ':'
  local ad = redis.call('HMGET', table_key, f .. 'attempts', f .. 'delivered_end', f .. 'lock_ts', f .. 'first')
  local attempts, delivered_end, best_lock_ts, first = num(ad[1]), num(ad[2]), num(ad[3]), num(ad[4])
  local start = best_committed
  if start < best_min then  -- retention dropped what was never consumed
    start, attempts = best_min, 0
  end
  local dead = attempts >= tonumber(args[at + 4])
  local again = attempts > 0 and delivered_end > start
  local max_count = tonumber(args[at + 2])
  local stop
  if dead then
    if again then stop = delivered_end else stop = math.min(start + max_count, best_max) end
  else
    if again then stop = delivered_end else stop = best_max end
    stop = math.min(stop, start + max_count)
    attempts = attempts + 1
    delivered_end = stop
  end
  local lock_ts = next_lock_ts(best_lock_ts, now)
  -- A new batch starts its own; a redelivery keeps it (0: a batch first delivered before 'first' was kept).
  if not again or first == 0 then first = lock_ts end
  redis.call('HSET', table_key,
    f .. 'committed', start,
    f .. 'attempts', attempts,
    f .. 'delivered_end', delivered_end,
    f .. 'lock_ts', lock_ts,
    f .. 'lock_deadline', now + tonumber(args[at + 3]),
    f .. 'owner', args[at + 5],
    f .. 'access', now,
    f .. 'first', first)
  return {best, start, stop, lock_ts, attempts, dead and 1 or 0, first}
end
