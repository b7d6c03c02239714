-- Soak: a mix of chat, streaming chat, embeddings and model-list requests, in a fixed rotation.
-- BENCH_CHAT, BENCH_STREAM, BENCH_EMBED: body files.  Every non-200 reply counts as bad.
package.path = debug.getinfo(1, "S").source:match("@?(.*/)") .. "?.lua;" .. package.path
local common = require("common")

local threads = {}
function setup(thread) table.insert(threads, thread) end

function init(args)
  bad = 0
  local key = "Bearer " .. (os.getenv("BENCH_KEY") or "none")
  local json = {["Content-Type"] = "application/json", ["Authorization"] = key, ["x-bench-route"] = "json"}
  local sse = {["Content-Type"] = "application/json", ["Authorization"] = key, ["x-bench-route"] = "sse"}
  local get = {["Authorization"] = key, ["x-bench-route"] = "json"}
  local chat = common.read(os.getenv("BENCH_CHAT"))
  reqs = {}
  -- 6 chat : 2 stream : 1 embeddings : 1 models
  for i = 1, 6 do table.insert(reqs, wrk.format("POST", "/v1/chat/completions", json, chat)) end
  for i = 1, 2 do table.insert(reqs, wrk.format("POST", "/v1/chat/completions", sse, common.read(os.getenv("BENCH_STREAM")))) end
  table.insert(reqs, wrk.format("POST", "/v1/embeddings", json, common.read(os.getenv("BENCH_EMBED"))))
  table.insert(reqs, wrk.format("GET", "/v1/models", get))
  n = 0
end

function request()
  n = n + 1
  return reqs[(n % #reqs) + 1]
end

function response(status, headers, body)
  if status ~= 200 then bad = bad + 1 end
end

function done(summary, latency, requests)
  local b = 0
  for _, t in ipairs(threads) do b = b + t:get("bad") end
  common.report(summary, latency, {bad_replies = b})
end
