-- Shared helpers for the mqgate wrk scripts (loaded with dofile from the other scripts).
local M = {}

-- wall clock in seconds (wrk's Lua has no clock of its own)
local ffi = require("ffi")
ffi.cdef[[
  typedef struct { long tv_sec; long tv_usec; } mqb_timeval;
  int gettimeofday(mqb_timeval *tv, void *tz);
]]
local tv = ffi.new("mqb_timeval")
function M.now()
  ffi.C.gettimeofday(tv, nil)
  return tonumber(tv.tv_sec) + tonumber(tv.tv_usec) / 1e6
end

function M.env(name, default)
  local v = os.getenv(name)
  if v == nil or v == "" then
    if default == nil then error("environment variable " .. name .. " is required") end
    return default
  end
  return v
end

function M.json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return string.format("\\u%04x", c:byte())
  end) .. '"'
end

function M.urlencode(s)
  return (s:gsub("[^%w%-%._~]", function(c) return string.format("%%%02X", c:byte()) end))
end

-- One machine-readable line for benchmarks/run.py. Values: numbers or strings only.
function M.report(fields)
  local parts = {}
  for k, v in pairs(fields) do
    if type(v) == "string" then
      parts[#parts + 1] = M.json_string(k) .. ":" .. M.json_string(v)
    else
      parts[#parts + 1] = M.json_string(k) .. ":" .. string.format("%.17g", v)
    end
  end
  io.write("MQBENCH {" .. table.concat(parts, ",") .. "}\n")
end

function M.summary_fields(summary, latency)
  local e = summary.errors
  return {
    requests = summary.requests,
    duration_us = summary.duration,
    bytes = summary.bytes,
    err_connect = e.connect, err_read = e.read, err_write = e.write,
    err_status = e.status, err_timeout = e.timeout,
    lat_p50_us = latency:percentile(50), lat_p90_us = latency:percentile(90),
    lat_p99_us = latency:percentile(99), lat_max_us = latency.max,
    lat_mean_us = latency.mean,
  }
end

return M
