--! include common.lua
-- Message-level mode: delete one received message, or change its visibility, by its receipt.
-- The port of core/message_window.py (delete, change_visibility). See README.md.
-- KEYS[1] table hash, KEYS[2] receipts hash, KEYS[3] visibility zset
-- ARGV[1] op ('delete' or 'visibility'), ARGV[2] broker, ARGV[3] queue, ARGV[4] offset,
-- ARGV[5] receives, ARGV[6] first receive ms, ARGV[7] now ms, ARGV[8] dead letter 0/1
-- (delete) or the new visible-at ms (visibility).
-- Returns -1 (no table), -2 (no such queue), or the outcome: 'deleted', 'already_deleted',
-- 'stale_receipt', 'changed', 'not_in_flight'.
local n = redis.call('HGET', KEYS[1], 'n')
if not n then return -1 end
local q = tonumber(ARGV[3])
if q < 0 or q >= tonumber(n) then return -2 end
local o = tonumber(ARGV[4])
local now = tonumber(ARGV[7])
local m, mv = KEYS[2], KEYS[3]
local cf = ARGV[2] .. ':' .. q .. ':committed'
local member = string.format('%d:%d', q, o)

local c = num(redis.call('HGET', KEYS[1], cf))
if o < c then return 'already_deleted' end
local state = redis.call('HGET', m, member)
if state == 'd' then return 'already_deleted' end
if not state then return 'stale_receipt' end
local visible, r, first = string.match(state, '^(%d+):(%d+):(%d+)$')
if r ~= ARGV[5] or first ~= ARGV[6] then return 'stale_receipt' end

if ARGV[1] == 'delete' then
  redis.call('HSET', m, member, 'd')
  redis.call('ZREM', mv, member)
  if ARGV[8] == '1' then redis.call('HINCRBY', KEYS[1], ARGV[2] .. ':' .. q .. ':dead', 1) end
  local e = num(redis.call('HGET', m, q .. ':end'))
  local moved = c
  while c < e and redis.call('HGET', m, string.format('%d:%d', q, c)) == 'd' do
    redis.call('HDEL', m, string.format('%d:%d', q, c))
    c = c + 1
  end
  if c ~= moved then redis.call('HSET', KEYS[1], cf, c) end
  return 'deleted'
end
if tonumber(visible) <= now then return 'not_in_flight' end
local until_ms = tonumber(ARGV[8])
redis.call('HSET', m, member, string.format('%d:%s:%s', until_ms, r, first))
redis.call('ZADD', mv, until_ms, member)
return 'changed'
