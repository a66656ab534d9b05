-- GET /mq/message?topic=T&consumer=C&max=N, acking each batch by passing its requestId on a
-- later pull (every requestId received is carried by exactly one later pull of this thread).
-- env: MQB_TOKEN (consumer token), MQB_TOPIC, MQB_CONSUMER, MQB_MAX (default 100),
--      MQB_TARGET (stop a thread after it received this many messages; 0 = no limit),
--      MQB_EMPTY_STOP (stop a thread after this many NO_NEW_MSG in a row, default 50)
local C = dofile(os.getenv("MQB_LUA_DIR") .. "/common.lua")

local token = C.env("MQB_TOKEN")
local base = "/mq/message?topic=" .. C.urlencode(C.env("MQB_TOPIC")) ..
  "&consumer=" .. C.urlencode(C.env("MQB_CONSUMER")) .. "&max=" .. C.env("MQB_MAX", "100")
local target = tonumber(C.env("MQB_TARGET", "0"))
local empty_stop = tonumber(C.env("MQB_EMPTY_STOP", "50"))
local headers = { ["Authorization"] = "Bearer " .. token }

-- thread-local state ------------------------------------------------------------------
local pending = {}        -- FIFO of requestIds not yet carried
local head, tail = 1, 0
received = 0              -- messages delivered (FOUND) to this thread
found = 0                 -- FOUND responses
empty = 0                 -- NO_NEW_MSG responses
other = 0                 -- any other result.status
http_err = 0              -- non-200 answers
acks_sent = 0             -- pulls that carried a requestId
acks_ok = 0               -- result.ack == "ok"
acks_bad = 0              -- result.ack present and not "ok"
no_token = 0              -- FOUND without a requestId (protocol violation)
first_err = ""
bad_ack = ""
t_start = 0
t_last_found = 0
drained = 0
local empty_run = 0

function request()
  if t_start == 0 then t_start = C.now() end
  local path = base
  if tail >= head then
    path = path .. "&requestId=" .. C.urlencode(pending[head])
    pending[head] = nil
    head = head + 1
    acks_sent = acks_sent + 1
  end
  return wrk.format("GET", path, headers)
end

local function count(body, needle)
  local n, i = 0, 1
  while true do
    local j = body:find(needle, i, true)
    if j == nil then return n end
    n = n + 1
    i = j + #needle
  end
end

function response(status, hdrs, body)
  if status ~= 200 then
    http_err = http_err + 1
    if first_err == "" then first_err = status .. " " .. body:sub(1, 300) end
    return
  end
  local ack = body:match('"ack"%s*:%s*"([^"]*)"')
  if ack ~= nil then
    if ack == "ok" then acks_ok = acks_ok + 1 else
      acks_bad = acks_bad + 1
      if bad_ack == "" then bad_ack = body:sub(1, 300) end
    end
  end
  local st = body:match('"status"%s*:%s*"([%u_]+)"')
  if st == "FOUND" then
    found = found + 1
    empty_run = 0
    received = received + count(body, '"messageId"')
    t_last_found = C.now()
    local rid = body:match('"requestId"%s*:%s*"([^"]+)"')
    if rid ~= nil then
      tail = tail + 1
      pending[tail] = rid
    else
      no_token = no_token + 1
    end
    if target > 0 and received >= target then wrk.thread:stop() end
  elseif st == "NO_NEW_MSG" then
    empty = empty + 1
    empty_run = empty_run + 1
    if received > 0 and empty_run >= empty_stop then
      drained = 1
      wrk.thread:stop()
    end
  else
    other = other + 1
    if first_err == "" then first_err = "status " .. tostring(st) .. " " .. body:sub(1, 300) end
  end
end

-- main thread -------------------------------------------------------------------------
local threads = {}
function setup(thread) threads[#threads + 1] = thread end

function done(summary, latency, requests)
  local f = C.summary_fields(summary, latency)
  local keys = { "received", "found", "empty", "other", "http_err", "acks_sent", "acks_ok",
                 "acks_bad", "no_token", "drained" }
  for _, k in ipairs(keys) do f[k] = 0 end
  f.t_start = 0
  f.t_last_found = 0
  f.first_err = ""
  f.bad_ack = ""
  f.unacked_tokens = 0
  for _, t in ipairs(threads) do
    for _, k in ipairs(keys) do f[k] = f[k] + (t:get(k) or 0) end
    local s = t:get("t_start") or 0
    if s > 0 and (f.t_start == 0 or s < f.t_start) then f.t_start = s end
    local l = t:get("t_last_found") or 0
    if l > f.t_last_found then f.t_last_found = l end
    if f.first_err == "" then f.first_err = t:get("first_err") or "" end
    if f.bad_ack == "" then f.bad_ack = t:get("bad_ack") or "" end
  end
  f.unacked_tokens = f.found - f.no_token - f.acks_sent
  f.threads = #threads
  C.report(f)
end
