-- Shared by the wrk scripts: request set-up from the environment and a JSON summary from done().
-- BENCH_METHOD, BENCH_PATH, BENCH_BODY (a file), BENCH_KEY (bearer key), BENCH_ROUTE (json|sse).
local M = {}

function M.read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

function M.setup_static()
  wrk.method = os.getenv("BENCH_METHOD") or "POST"
  wrk.path = os.getenv("BENCH_PATH") or "/"
  local body = os.getenv("BENCH_BODY")
  if body and body ~= "" then
    wrk.body = M.read(body)
    wrk.headers["Content-Type"] = "application/json"
  end
  wrk.headers["Authorization"] = "Bearer " .. (os.getenv("BENCH_KEY") or "none")
  wrk.headers["x-bench-route"] = os.getenv("BENCH_ROUTE") or "json"
end

-- One line the harness parses: everything it reports comes from here.
function M.report(summary, latency, extra)
  local e = summary.errors
  local s = string.format(
    '{"requests":%d,"duration_us":%d,"bytes":%d,"err_connect":%d,"err_read":%d,"err_write":%d,' ..
    '"err_status":%d,"err_timeout":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean)
  for k, v in pairs(extra or {}) do
    s = s .. string.format(',"%s":%d', k, v)
  end
  io.write("BENCH_RESULT " .. s .. "}\n")
end

return M
