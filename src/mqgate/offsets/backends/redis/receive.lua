--! include common.lua
-- Message-level mode: hand out up to `want` messages, each hidden for its visibility timeout.
-- The port of core/message_window.py (receive). See README.md.
-- KEYS[1] table hash, KEYS[2] clients zset, KEYS[3] receipts hash, KEYS[4] visibility zset
-- ARGV[1] now ms, ARGV[2] want, ARGV[3] visibility ms, ARGV[4] max attempts, ARGV[5] window,
-- ARGV[6] client id, ARGV[7] broker, ARGV[8] ordered 0/1 (core/message_window.py's
-- receive_ordered: a queue with a message hidden hands out nothing, else its messages in offset
-- order), then queue, min, max for each queue, in the order messages are taken from them (the
-- caller rotates it).
-- Returns -1 (no table), {-2, queues in table} (a queue not in the table), or a flat list of
-- queue, offset, receives, first receive ms, dead letter 0/1 for each message handed out.
local now = tonumber(ARGV[1])
local want = tonumber(ARGV[2])
local vis = tonumber(ARGV[3])
local max_attempts = tonumber(ARGV[4])
local window = tonumber(ARGV[5])
local broker = ARGV[7]
local ordered = ARGV[8] == '1'
local n = redis.call('HGET', KEYS[1], 'n')
if not n then return -1 end
n = tonumber(n)
redis.call('ZADD', KEYS[2], 'GT', now, ARGV[6])
local m, mv = KEYS[3], KEYS[4]

local queues = {}
for i = 9, #ARGV, 3 do
  local q = tonumber(ARGV[i])
  if q < 0 or q >= n then return {-2, n} end
  queues[#queues + 1] = {q, tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])}
end

local function key(q, o) return string.format('%d:%d', q, o) end
local function committed_field(q) return broker .. ':' .. q .. ':committed' end
local function hidden(visible, receives, first)
  return string.format('%d:%d:%d', visible, receives, first)
end

-- Retention removed what the window held below a queue's min: so goes its state.
local committed, ends = {}, {}
for _, t in ipairs(queues) do
  local q, lo = t[1], t[2]
  local c = num(redis.call('HGET', KEYS[1], committed_field(q)))
  local e = math.max(num(redis.call('HGET', m, q .. ':end')), c)
  if c < lo then
    for o = c, math.min(lo, e) - 1 do
      redis.call('HDEL', m, key(q, o))
      redis.call('ZREM', mv, key(q, o))
    end
    c = lo
    if e < lo then e = lo end
    while c < e and redis.call('HGET', m, key(q, c)) == 'd' do
      redis.call('HDEL', m, key(q, c))
      c = c + 1
    end
    redis.call('HSET', KEYS[1], committed_field(q), c)
    redis.call('HSET', m, q .. ':end', e)
  end
  committed[q], ends[q] = c, e
end

local out = {}

local function again(member, q, o, r, first)
  local dead = 0
  if r >= max_attempts then dead = 1 else r = r + 1 end
  redis.call('HSET', m, member, hidden(now + vis, r, first))
  redis.call('ZADD', mv, now + vis, member)
  out[#out + 1] = {q, o, r, first, dead}
end

local function take_new(t)
  local q, hi = t[1], t[3]
  local c, e = committed[q], ends[q]
  local before = e
  while #out < want and e < hi and e - c < window do
    local member = key(q, e)
    redis.call('HSET', m, member, hidden(now + vis, 1, now))
    redis.call('ZADD', mv, now + vis, member)
    out[#out + 1] = {q, e, 1, now, 0}
    e = e + 1
  end
  if e ~= before then redis.call('HSET', m, q .. ':end', e) end
end

if ordered then
  for _, t in ipairs(queues) do
    if #out >= want then break end
    local q = t[1]
    local blocked, back = false, {}
    for o = committed[q], ends[q] - 1 do
      local state = redis.call('HGET', m, key(q, o))
      if state and state ~= 'd' then
        local visible, r, first = string.match(state, '^(%d+):(%d+):(%d+)$')
        if tonumber(visible) > now then blocked = true break end
        back[#back + 1] = {o, tonumber(r), tonumber(first)}
      end
    end
    if not blocked then
      for _, b in ipairs(back) do
        if #out >= want then break end
        again(key(q, b[1]), q, b[1], b[2], b[3])
      end
      take_new(t)
    end
  end
  local flat = {}
  for _, r in ipairs(out) do
    for _, x in ipairs(r) do flat[#flat + 1] = x end
  end
  return flat
end

-- Visible again first: received before, not deleted, its timeout run out.
local due = redis.call('ZRANGEBYSCORE', mv, '-inf', now, 'LIMIT', 0, want)
for _, member in ipairs(due) do
  local state = redis.call('HGET', m, member)
  local q, o = string.match(member, '^(%d+):(%d+)$')
  local _, r, first
  if state then _, r, first = string.match(state, '^(%d+):(%d+):(%d+)$') end
  if r then
    again(member, tonumber(q), tonumber(o), tonumber(r), tonumber(first))
  else
    redis.call('ZREM', mv, member)  -- deleted or forgotten meanwhile
  end
end

-- Then new messages, while each queue's window has room.
for _, t in ipairs(queues) do
  if #out >= want then break end
  take_new(t)
end

local flat = {}
for _, r in ipairs(out) do
  for _, x in ipairs(r) do flat[#flat + 1] = x end
end
return flat
