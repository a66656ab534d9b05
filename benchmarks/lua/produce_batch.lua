-- POST /mq/produce/batch, MQB_BATCH (default 100) messages of ~100 bytes per request.
-- env: MQB_TOKEN, MQB_PRODUCER, MQB_BATCH, MQB_MSG_BYTES (default 100)
local C = dofile(os.getenv("MQB_LUA_DIR") .. "/common.lua")

local n = tonumber(C.env("MQB_BATCH", "100"))
local msg = string.rep("x", tonumber(C.env("MQB_MSG_BYTES", "100")))
local items = {}
for i = 1, n do items[i] = '{"message":"' .. msg .. '"}' end

wrk.method = "POST"
wrk.path = C.env("MQB_PATH", "/mq/produce/batch")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. C.env("MQB_TOKEN")
wrk.body = '{"producer":' .. C.json_string(C.env("MQB_PRODUCER")) .. ',"messages":[' ..
  table.concat(items, ",") .. ']}'

function done(summary, latency, requests)
  local f = C.summary_fields(summary, latency)
  f.batch = n
  f.body_bytes = #wrk.body
  C.report(f)
end
