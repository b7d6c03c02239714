-- A streaming chat request; every reply is checked to be 200 and to end with the stream's
-- `data: [DONE]` event (a truncated or failed stream counts as bad).
package.path = debug.getinfo(1, "S").source:match("@?(.*/)") .. "?.lua;" .. package.path
local common = require("common")
common.setup_static()
wrk.headers["Accept"] = "text/event-stream"

local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) bad = 0; checked = 0 end
function response(status, headers, body)
  checked = checked + 1
  if status ~= 200 or not body:find("data: [DONE]", math.max(1, #body - 64), true) then bad = bad + 1 end
end

function done(summary, latency, requests)
  local b, c = 0, 0
  for _, t in ipairs(threads) do b = b + t:get("bad"); c = c + t:get("checked") end
  common.report(summary, latency, {bad_streams = b, checked_streams = c})
end
