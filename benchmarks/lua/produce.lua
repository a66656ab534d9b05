-- POST /mq/produce, one ~100-byte message per request.
-- env: MQB_TOKEN (producer token), MQB_PRODUCER, MQB_MSG_BYTES (default 100),
--      MQB_PATH (default /mq/produce; the HTTP baseline uses the same script)
local C = dofile(os.getenv("MQB_LUA_DIR") .. "/common.lua")

wrk.method = "POST"
wrk.path = C.env("MQB_PATH", "/mq/produce")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. C.env("MQB_TOKEN")
local msg = string.rep("x", tonumber(C.env("MQB_MSG_BYTES", "100")))
wrk.body = '{"producer":' .. C.json_string(C.env("MQB_PRODUCER")) .. ',"message":"' .. msg .. '"}'

function done(summary, latency, requests)
  local f = C.summary_fields(summary, latency)
  f.body_bytes = #wrk.body
  C.report(f)
end
