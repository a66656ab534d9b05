-- Shared by the message-store scripts. Offset N of a queue is the stream entry ID "N-1";
-- a queue holds every offset from its min to max-1, so entry lookups by offset are exact.

-- Numbers written back as integers (Redis may print a large Lua number in exponent form).
local function int(n)
  return string.format('%d', n)
end

local function entry_id(offset)
  return string.format('%d-1', offset)
end

-- The timestamp (ms) of the message at `offset`, or nil if it is not stored.
local function ts_at(stream, offset)
  local e = redis.call('XRANGE', stream, entry_id(offset), '+', 'COUNT', 1)[1]
  if not e then
    return nil
  end
  return tonumber(e[2][2])
end

-- The first offset in [lo, hi) whose timestamp is at or after `ts`, or `hi`.
local function first_at_or_after(stream, lo, hi, ts)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local t = ts_at(stream, mid)
    if t ~= nil and t < ts then
      lo = mid + 1
    else
      hi = mid
    end
  end
  return lo
end
