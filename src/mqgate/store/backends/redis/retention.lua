--! include common.lua
-- Drop the oldest messages of each queue past the topic's age or size limit.
-- KEYS[1] = meta hash, KEYS[2 + q] = stream of queue q (q = 0, 1, ...)
-- ARGV[1] = now (ms), ARGV[2] = most messages to drop per queue in this call
-- Returns {messages dropped, 1 if a queue reached the per-call limit (call again) else 0}.
local meta = KEYS[1]
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local cfg = redis.call('HMGET', meta, 'retention_ms', 'retention_bytes')
local keep_ms, keep_bytes = tonumber(cfg[1]), tonumber(cfg[2])
local page = 256
local dropped, more = 0, 0
for k = 2, #KEYS do
  local q = k - 2
  local stream = KEYS[k]
  local st = redis.call('HMGET', meta, 'min:' .. q, 'max:' .. q, 'bytes:' .. q)
  local lo, hi, bytes = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
  if lo and hi > lo then
    local stop = math.min(hi, lo + limit)
    local by_age = lo
    if keep_ms then
      local oldest = ts_at(stream, lo)
      if oldest ~= nil and oldest < now - keep_ms then
        by_age = first_at_or_after(stream, lo, stop, now - keep_ms)
      end
    end
    -- Walk the doomed entries to learn their size (and, by size, where to stop).
    local cut, removed = lo, 0
    local function doomed()
      return cut < stop and (cut < by_age or (keep_bytes ~= nil and bytes - removed > keep_bytes))
    end
    while doomed() do
      local es = redis.call('XRANGE', stream, entry_id(cut), entry_id(stop - 1), 'COUNT', page)
      if #es == 0 then
        break
      end
      for i = 1, #es do
        if not doomed() then
          break
        end
        removed = removed + #es[i][2][4]
        cut = cut + 1
      end
    end
    if cut > lo then
      redis.call('XTRIM', stream, 'MINID', entry_id(cut))
      redis.call('HSET', meta, 'min:' .. q, int(cut))
      redis.call('HINCRBY', meta, 'bytes:' .. q, int(-removed))
      dropped = dropped + (cut - lo)
      if cut == lo + limit and cut < hi then
        more = 1
      end
    end
  end
end
return {dropped, more}
