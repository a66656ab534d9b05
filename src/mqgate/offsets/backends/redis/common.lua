-- Shared by the offset-table scripts (pasted in front by `--! include common.lua`).
-- Ports of mqgate.core.queue_choice and mqgate.core.acks: keep them identical.

-- A missing hash field means 0 (tables store only what has been set).
local function num(v)
  if v then return tonumber(v) end
  return 0
end

local function lock_is_held(lock_ts, deadline, now)
  return lock_ts ~= 0 and deadline > now
end

-- Lock timestamps identify a lock, so a new one must differ from the one it replaces.
local function next_lock_ts(previous, now)
  if now > previous then return now end
  return previous + 1
end

-- nil if the token's batch may be settled now, else why not (SPEC G5).
local function ack_refusal(committed, lock_ts, deadline, acked_lock_ts, token_offset, token_lock_ts, now)
  if token_lock_ts ~= 0 and token_lock_ts == acked_lock_ts then return 'already_acked' end
  if committed ~= token_offset then return 'offset_moved' end
  if lock_ts == token_lock_ts then
    if lock_is_held(lock_ts, deadline, now) then return nil end
    return 'lock_expired'
  end
  if lock_ts == 0 or not lock_is_held(lock_ts, deadline, now) then return 'lock_expired' end
  return 'lock_taken'
end

-- HMGET/HSET with any number of fields: Lua's unpack fails past a few thousand values.
local CHUNK = 1000

local function hmget(key, fields)
  if #fields <= CHUNK then return redis.call('HMGET', key, unpack(fields)) end
  local out = {}
  for i = 1, #fields, CHUNK do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(i + CHUNK - 1, #fields)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end

-- `kv` is a flat list: field, value, field, value...
local function hset(key, kv)
  for i = 1, #kv, CHUNK do
    redis.call('HSET', key, unpack(kv, i, math.min(i + CHUNK - 1, #kv)))
  end
end
