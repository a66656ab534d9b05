-- Alibaba Cloud MQ's HTTP API, a publish: one pre-signed request (`MQ <key>:<HMAC-SHA1>`, signed
-- by benchmarks/bench/aliyun.py just before the run, as the Python SDK signs) replayed as it is.
-- The signature covers the method, Content-Type, Date, x-mq-version and the request line, not the
-- body; the gateway accepts it for 15 minutes (its clock skew).
-- env: MQB_BODY (the XML body), MQB_DATE, MQB_AUTHORIZATION, MQB_PATH (path and query)
local C = dofile(os.getenv("MQB_LUA_DIR") .. "/common.lua")

wrk.method = "POST"
wrk.path = C.env("MQB_PATH")
wrk.headers["Content-Type"] = "text/xml;charset=UTF-8"
wrk.headers["Date"] = C.env("MQB_DATE")
wrk.headers["x-mq-version"] = "2015-06-06"
wrk.headers["Authorization"] = C.env("MQB_AUTHORIZATION")
wrk.body = C.env("MQB_BODY")

function done(summary, latency, requests)
  local f = C.summary_fields(summary, latency)
  f.body_bytes = #wrk.body
  C.report(f)
end
