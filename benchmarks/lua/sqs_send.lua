-- SQS SendMessage over the AWS JSON 1.0 protocol: one pre-signed request (SigV4, signed by
-- benchmarks/bench/sqs.py just before the run) replayed as it is. The signature covers the
-- date and the body, both fixed; the gateway accepts it for 15 minutes (its clock skew).
-- env: MQB_BODY (the JSON body), MQB_AMZ_DATE, MQB_AUTHORIZATION, MQB_HOST (the Host signed),
--      MQB_AMZ_TARGET (default AmazonSQS.SendMessage), MQB_PATH (default /)
local C = dofile(os.getenv("MQB_LUA_DIR") .. "/common.lua")

wrk.method = "POST"
wrk.path = C.env("MQB_PATH", "/")
wrk.headers["Host"] = C.env("MQB_HOST")
wrk.headers["Content-Type"] = "application/x-amz-json-1.0"
wrk.headers["X-Amz-Target"] = C.env("MQB_AMZ_TARGET", "AmazonSQS.SendMessage")
wrk.headers["X-Amz-Date"] = C.env("MQB_AMZ_DATE")
wrk.headers["Authorization"] = C.env("MQB_AUTHORIZATION")
wrk.body = C.env("MQB_BODY")

function done(summary, latency, requests)
  local f = C.summary_fields(summary, latency)
  f.body_bytes = #wrk.body
  C.report(f)
end
