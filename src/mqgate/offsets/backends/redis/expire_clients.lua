-- Remove the broadcast tables of clients still idle since ARGV[1]. See README.md.
-- KEYS[1] clients zset, KEYS[2..] the candidates' table hashes
-- ARGV[1] idle-before ms, ARGV[2..] the candidates' client ids (same order as KEYS[2..])
-- Candidates come from a read just before; each is checked again here, so a client seen in
-- between stays. Returns the client ids removed.
local idle_before = tonumber(ARGV[1])
local gone = {}
for i = 2, #ARGV do
  local seen = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if ARGV[i] ~= '' and seen and tonumber(seen) < idle_before then
    redis.call('DEL', KEYS[i])
    redis.call('ZREM', KEYS[1], ARGV[i])
    gone[#gone + 1] = ARGV[i]
  end
end
return gone
