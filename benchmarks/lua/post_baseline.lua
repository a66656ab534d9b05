-- POST a small JSON body (same shape and size as a gateway produce)
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer baseline-token-not-checked"
wrk.body = '{"producer":"bench-producer","message":"' .. string.rep("x", 100) .. '"}'
