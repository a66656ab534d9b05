-- Shared by the scheduler scripts (pasted in front by `--! include common.lua`). See README.md.
-- Every script gets the same KEYS, all in the hash tag {s:<name>}:
--   KEYS[1] seq     string  the last sequence number assigned (INCRBY)
--   KEYS[2] msg     hash    seq -> payload
--   KEYS[3] dst     hash    member -> destination, msgpack [target, deliver_at_ms, deadline_ms, priority]
--   KEYS[4] left    hash    seq -> destinations not settled yet
--   KEYS[5] due     zset    member -> deliver_at_ms, waiting and unclaimed
--   KEYS[6] ready   zset    member -> rank (priority, deliver_at_ms), due and unclaimed
--   KEYS[7] claims  zset    member -> claim deadline ms
--   KEYS[8] tries   hash    member -> times claimed
--   KEYS[9] targets hash    target -> destinations held for it, not settled yet
--   KEYS[10] once   hash    hold key -> seq of the message held under it (hold.lua, forget.lua)
--   KEYS[11] once_until zset hold key -> ms until which it is kept
-- A member is '<seq:015d>:<index:05d>': zero-padded, so members of equal score sort by seq
-- then index, exactly like mqgate.core.scheduling.delivery_order.

local SEQ, MSG, DST, LEFT, DUE, READY, CLAIMS, TRIES, TARGETS, ONCE, ONCE_UNTIL = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11

local function member(seq, index)
  return string.format('%015d:%05d', seq, index)
end

local function seq_of(m)
  return string.format('%d', tonumber(string.sub(m, 1, 15)))
end

-- Port of mqgate.core.scheduling.delivery_rank without seq and index (the member breaks ties):
-- highest priority first, then the earliest start. Exact in a double: below 10 * 2^47.
local TIME_SPAN = 140737488355328  -- 2^47

local function rank(raw)
  local d = cmsgpack.unpack(raw)
  return (9 - d[4]) * TIME_SPAN + d[2]
end

-- Publish on `channel` when `earliest` comes before every start in the due set (read before
-- the new members were added): a sleeping delivery loop may have to wake up sooner.
local function wake_if_sooner(channel, earliest, current)
  if earliest and (#current == 0 or earliest < tonumber(current[2])) then
    redis.call('PUBLISH', channel, string.format('%d', earliest))
  end
end
