-- One fixed request (POST with a JSON body, or a GET), the same for every system.  No response()
-- callback: wrk's fast path; non-2xx replies are counted by wrk itself (status >= 400).
package.path = debug.getinfo(1, "S").source:match("@?(.*/)") .. "?.lua;" .. package.path
local common = require("common")
common.setup_static()

function done(summary, latency, requests)
  common.report(summary, latency)
end
