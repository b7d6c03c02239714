-- The relay of a model server's server-sent event stream to the client (docs/interface.md section 4, streaming rules),
-- run by Envoy on every chunk of a streamed reply as it passes: nothing is held back but an event not
-- complete yet, so every event the model server sent before it failed reaches the client.
--
-- It passes whole events only, each as the interface's streaming rule 1 writes it (one "data: " line and a blank line:
-- comments, other fields and events without data are left out, data over several lines joined into one),
-- with the upstream model name replaced by the alias, and the usage (the gateway always asks the model
-- server for it) shown as the interface's streaming rule 3 wants it or taken out when the client did not ask for it;
-- when it asked and the model server reported none, the usage the request is billed (the estimated input,
-- one output token per event with content: extproc/observer.py) comes as the last chunk before [DONE].
-- The ext_proc reads the same bytes for billing (core/sse.py), without holding them; what both count
-- is one table of cases (tests/sse_cases.py) run against each.  It works on bytes; only an event that
-- carries a usage object is taken apart, by a small JSON scanner (Envoy's Lua has no JSON library), and
-- vLLM's own usage chunk is told by one pattern.  Its plain searches begin on a letter, not a quote
-- (``find_quoted``): LuaJIT's plain search stops at each byte equal to the needle's first.
-- The common case, whole events in vLLM's shape, goes straight on (``Relay:feed``), and Envoy's access
-- log counts the chunks it took (relay_chunks, relay_common).
--
-- Framing (the SSE format): lines end with LF, CRLF or CR; a blank line ends an event; lines starting with
-- a colon are comments; an event's data may span several "data:" lines (joined by LF).  A stream with CRs
-- is rewritten with LFs as it passes (an LF right after a CR that ended the previous chunk is dropped).  An
-- event the stream never ends with a blank line is not relayed: SSE clients discard it too.
--
-- The ext_proc names the stream in the response header x-gateway-stream (core/stream_context.py, whose
-- WIRE names its members: "a" the alias and "u" the upstream model as JSON strings, "w" 1 when the client
-- asked for usage, "p" the estimated input tokens, "i" and "x" the input and output prices, for the cost
-- in the usage shown); it is removed here.  The file is also loaded by the unit tests (tests/test_sse.py,
-- through tests/lua_relay.py) in LuaJIT through lupa, outside Envoy.

local find, sub, gsub, byte = string.find, string.sub, string.gsub, string.byte

-- The first "name..." at or after i, found by what follows its opening quote (``needle`` is the text
-- without it), the quote checked after: LuaJIT's plain search runs memchr on a needle's first byte, and a
-- quote starts every JSON token (a few dozen in each chunk) where a letter is rarer.
local function find_quoted(s, needle, i)
  local from = i + 1
  while true do
    local at, stop = find(s, needle, from, true)
    if at == nil then return nil end
    if byte(s, at - 1) == 34 then return at - 1, stop end
    from = at + 1
  end
end

local function skip_ws(s, i)
  return find(s, "[^ \t\r\n]", i) or #s + 1
end

-- s[i] is a quote: the index after the string's closing quote (nil: unterminated)
local function skip_string(s, i)
  local j = i + 1
  while true do
    local q = find(s, '["\\]', j)
    if q == nil then return nil end
    if byte(s, q) == 92 then j = q + 2 else return q + 1 end
  end
end

-- the index after the JSON value that starts at or after i (nil: not a whole value)
local function skip_value(s, i)
  i = skip_ws(s, i)
  local c = byte(s, i)
  if c == 34 then return skip_string(s, i) end
  if c == 123 or c == 91 then
    local depth, j = 0, i
    while true do
      local q = find(s, '[{}%[%]"]', j)
      if q == nil then return nil end
      local b = byte(s, q)
      if b == 34 then
        j = skip_string(s, q)
        if j == nil then return nil end
      else
        depth = depth + ((b == 123 or b == 91) and 1 or -1)
        j = q + 1
        if depth == 0 then return j end
      end
    end
  end
  if c == nil then return nil end
  return find(s, "[,}%]%s]", i) or #s + 1
end

-- The items of the JSON object (``keyed``) or array at i: a list of {key (nil in an array), item start,
-- value start, value end (exclusive)}, or nil when it is not one.
local function items(s, i, keyed)
  local open, close = keyed and 123 or 91, keyed and 125 or 93
  i = skip_ws(s, i)
  if byte(s, i) ~= open then return nil end
  local out = {}
  i = skip_ws(s, i + 1)
  if byte(s, i) == close then return out end
  while true do
    local key, vs = nil, i
    if keyed then
      if byte(s, i) ~= 34 then return nil end
      local kend = skip_string(s, i)
      if kend == nil then return nil end
      local j = skip_ws(s, kend)
      if byte(s, j) ~= 58 then return nil end
      key, vs = sub(s, i + 1, kend - 2), skip_ws(s, j + 1)
    end
    local ve = skip_value(s, vs)
    if ve == nil then return nil end
    out[#out + 1] = {key, i, vs, ve}
    i = skip_ws(s, ve)
    local c = byte(s, i)
    if c == close then return out end
    if c ~= 44 then return nil end
    i = skip_ws(s, i + 1)
  end
end

local function value(s, m)
  return sub(s, m[3], m[4] - 1)
end

-- Python's truth of a JSON value: what "says nothing" (null, false, 0, "", {}, [])
local function falsy(v)
  if byte(v, 1) == 34 then return v == '""' end
  v = gsub(v, "%s", "")
  return v == "null" or v == "false" or v == "{}" or v == "[]" or find(v, "^%-?0+%.?0*$") ~= nil
end

-- A usage object as billing reads it (core/cost.py usage_json_tokens): a whole prompt_tokens, and a
-- whole completion_tokens or none.  Its (prompt, completion) tokens, or nil.
local function usage_tokens(u)
  local m = items(u, 1, true)
  if m == nil then return nil end
  local prompt, completion = nil, "0"
  for _, x in ipairs(m) do
    if x[1] == "prompt_tokens" then prompt = value(u, x)
    elseif x[1] == "completion_tokens" then completion = value(u, x) end
  end
  if completion == "null" then completion = "0" end
  if prompt == nil or find(prompt, "^%d+$") == nil or find(completion, "^%d+$") == nil then return nil end
  return tonumber(prompt), tonumber(completion)
end

-- ceil(a / 1e6) of a whole a below 2^53, exactly (math.fmod is exact on doubles)
local function millionths_up(a)
  local r = math.fmod(a, 1000000)
  return (a - r) / 1000000 + (r > 0 and 1 or 0)
end

-- What the request is billed, as core/cost.py cost_micro_pln rounds it (each term up on its own), in
-- LuaJIT's doubles: a price split into whole millions and the rest keeps every product below 2^53, so
-- the figure is exact for any count under 9e9 tokens.
local function cost_micro_pln(prompt, completion, input_price, output_price)
  local function term(tokens, price)
    local rest = math.fmod(price, 1000000)
    return tokens * ((price - rest) / 1000000) + millionths_up(tokens * rest)
  end
  return string.format("%.0f", term(prompt, input_price) + term(completion, output_price))
end

-- A usage object (JSON text) the model server reported, with what the request is billed as its last
-- member (docs/interface.md, "Usage"): a model server's own cost_micro_pln or estimated is taken out first.
local function priced(u, cost)
  if find(u, '"cost_micro_pln"', 1, true) or find(u, '"estimated"', 1, true) then
    local kept = {}
    for _, x in ipairs(items(u, 1, true)) do
      if x[1] ~= "cost_micro_pln" and x[1] ~= "estimated" then kept[#kept + 1] = sub(u, x[2], x[4] - 1) end
    end
    u = "{" .. table.concat(kept, ",") .. "}"
  end
  return sub(u, 1, -2) .. ',"cost_micro_pln":' .. cost .. "}"
end

local function says_nothing(choice)
  local m = items(choice, 1, true)
  if m == nil then return false end
  for _, x in ipairs(m) do
    if x[1] ~= "index" and not falsy(value(choice, x)) then return false end
  end
  return true
end

-- The delta of a choice that carries a finish_reason and a delta saying nothing new (a role, empty
-- content: TGI's finish chunk), as an item of ``items``; nil for any other choice.
local function idle_closing_delta(data, choice)
  local delta, finish = nil, nil
  for _, m in ipairs(items(data, choice[3], true) or {}) do
    if m[1] == "delta" then delta = m elseif m[1] == "finish_reason" then finish = m end
  end
  if delta == nil or finish == nil or value(data, finish) == "null" then return nil end
  local members = items(data, delta[3], true)
  if members == nil or #members == 0 then return nil end
  for _, d in ipairs(members) do
    if d[1] ~= "role" and not falsy(value(data, d)) then return nil end
  end
  return delta
end

-- A chunk's data with each such delta emptied: the choice closed by an empty delta, as the interface's streaming
-- rule 2 has it.  A delta with content is left as it came.
local function empty_closing_deltas(data)
  local cuts = {}
  for _, x in ipairs(items(data, 1, true) or {}) do
    if x[1] == "choices" then
      for _, c in ipairs(items(data, x[3], false) or {}) do
        cuts[#cuts + 1] = idle_closing_delta(data, c)
      end
    end
  end
  for k = #cuts, 1, -1 do
    data = sub(data, 1, cuts[k][3] - 1) .. "{}" .. sub(data, cuts[k][4])
  end
  return data
end

-- the data of one LF-framed event (its "data:" lines joined by LF), nil when it has none
local function event_data(event)
  local parts = {}
  for line in string.gmatch(event, "([^\n]*)\n") do
    if sub(line, 1, 6) == "data: " then parts[#parts + 1] = sub(line, 7)
    elseif sub(line, 1, 5) == "data:" then parts[#parts + 1] = sub(line, 6) end
  end
  if #parts == 0 then return nil end
  return table.concat(parts, "\n")
end

-- an event of the given data (data over several lines stays so)
local function data_lines(data)
  return "data: " .. gsub(data, "\n", "\ndata: ") .. "\n\n"
end

local function escape_pattern(s)
  return (gsub(s, "[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0"))
end

-- Events with a content piece, as core/sse.py's StreamMeter counts them (the same rule on the same
-- bytes, so that a usage chunk of our own says what the request is billed): a "content" member whose
-- value is a string that is not empty.  The meter reads vLLM's compact JSON by plain searches
-- ("content":" then no quote) and spaced JSON (a block with "content": or "usage": ) by a pattern that
-- allows white space before the string; one pass counts both ways and picks the meter's.
local function count_content(block)
  local compact, spaced, pos, space = 0, 0, 1, false
  while true do
    local _, j = find_quoted(block, 'content":', pos)
    if j == nil then break end
    local q = j + 1
    local c = byte(block, q)
    if c == 32 then space = true end
    while c == 32 or (c ~= nil and c >= 9 and c <= 13) do q = q + 1; c = byte(block, q) end
    if c == 34 and byte(block, q + 1) ~= 34 then
      spaced = spaced + 1
      if q == j + 1 then compact = compact + 1 end
    end
    pos = q
  end
  if compact == spaced then return compact end
  return (space or find_quoted(block, 'usage": ', 1)) and spaced or compact
end

-- Whether every event of an LF-framed block is one "data: " line and a blank line (what vLLM writes).
local function canonical(block)
  local pos = 1
  while true do
    if sub(block, pos, pos + 5) ~= "data: " then return false end
    local i = find(block, "\n", pos, true)
    if i == nil or byte(block, i + 1) ~= 10 then return false end
    pos = i + 2
    if pos > #block then return true end
  end
end

-- The block's events as the interface's streaming rule 1 writes them: one "data: " line each, the data of several
-- lines joined (by a space: a line break inside JSON can only fall between tokens), comments, other
-- fields and events without data left out.
local function canonicalize(block)
  local out = {}
  for event in string.gmatch(block, "(.-\n)\n") do
    local data = event_data(event)
    if data ~= nil then out[#out + 1] = "data: " .. gsub(data, "\n", " ") .. "\n\n" end
  end
  return table.concat(out)
end

-- A "usage": null member (sent on every chunk by some servers) taken out: the interface shows usage only on the
-- final chunk, and only when it was asked for.
local function drop_null_usage(block, from)
  if not (find_quoted(block, 'usage":null', from) or find_quoted(block, 'usage": null', from)) then return block end
  block = gsub(block, ',%s*"usage"%s*:%s*null', "")
  return (gsub(block, '"usage"%s*:%s*null%s*,%s*', ""))
end

-- the bytes of s, as a list (a loop: LuaJIT does not compile a table built of byte's many results)
local function bytes(s)
  local out = {}
  for k = 1, #s do out[k] = byte(s, k) end
  return out
end

-- whether the bytes after s[j] are ``bytes`` (a list of bytes): compared one by one, without a string made
local function follows(s, j, bytes)
  for k = 1, #bytes do
    if byte(s, j + k) ~= bytes[k] then return false end
  end
  return true
end

local Relay = {}
Relay.__index = Relay

-- upstream_model, alias: JSON string tokens (quotes included) as they appear in the model server's JSON
-- (input_price, output_price: micro-PLN per million tokens, as text, for the cost in the usage shown)
function Relay.new(upstream_model, alias, show_usage, prompt_estimate, input_price, output_price)
  return setmetatable({
    buf = "", cr = false, show = show_usage, held = nil,
    -- for a usage chunk of our own: whether the model server reported usage, the events with content,
    -- the stream's id and created (JSON tokens), the alias (a JSON string token), the estimated input
    reported = false, content = 0, id = nil, created = nil, alias_token = alias,
    prompt = tonumber(prompt_estimate or "0") or 0,
    input_price = tonumber(input_price or "0") or 0, output_price = tonumber(output_price or "0") or 0,
    -- the chunks fed (empty ones aside), and those the common case took (``feed``)
    chunks = 0, common = 0,
    tail = bytes(':' .. upstream_model), renamed = '"model":' .. alias,
    model = '"model"%s*:%s*' .. escape_pattern(upstream_model),
    alias = gsub('"model":' .. alias, "%%", "%%%%"),
  }, Relay)
end

-- The alias in place of the upstream model, in one pass over the block's "model" members: a plain search
-- each (a pattern tried at every byte costs several times more), vLLM's compact JSON renamed as it goes;
-- a "model" member with a space around its colon sends the whole block to the pattern.
function Relay:rename(block)
  local out, pos, from, tail, renamed = nil, 1, 1, self.tail, self.renamed
  while true do
    local i, j = find_quoted(block, 'model"', from)
    if i == nil then break end
    local c = byte(block, j + 1)
    if c == 32 or (c == 58 and byte(block, j + 2) == 32) then return (gsub(block, self.model, self.alias)) end
    from = j + 1
    if c == 58 and follows(block, j, tail) then
      out = out or {}
      out[#out + 1] = sub(block, pos, i - 1)
      out[#out + 1] = renamed
      pos, from = j + #tail + 1, j + #tail + 1
    end
  end
  if out == nil then return block end
  out[#out + 1] = sub(block, pos)
  return table.concat(out)
end

-- The bytes to pass on for the next chunk of the reply (cut anywhere).  The common case, the shape of
-- vLLM's and the simulator's streams (whole events, each one "data: " line and a blank line, LF only,
-- nothing held from the chunk before), goes straight on; the rest (the SSE format's other framings, an
-- event cut in two) is framed first.  ``common`` counts the chunks the common case took.
function Relay:feed(chunk)
  if chunk == "" then return "" end
  self.chunks = self.chunks + 1
  if self.buf == "" and not self.cr and byte(chunk, -1) == 10 and byte(chunk, -2) == 10
      and not find(chunk, "\r", 1, true) and canonical(chunk) then
    self.common = self.common + 1
    return self:relay(chunk, chunk)
  end
  if self.cr or find(chunk, "\r", 1, true) then
    if self.cr and byte(chunk, 1) == 10 then chunk = sub(chunk, 2) end  -- the LF of a CRLF cut in two
    self.cr = byte(chunk, -1) == 13
    chunk = gsub(gsub(chunk, "\r\n", "\n"), "\r", "\n")
  end
  local data = self.buf == "" and chunk or self.buf .. chunk
  local cut, s = nil, 1
  if sub(data, -2) == "\n\n" then
    cut = #data - 1  -- the common case: a model server writes whole events
  else
    while true do
      local i = find(data, "\n\n", s, true)
      if i == nil then break end
      cut, s = i, i + 1
    end
  end
  if cut == nil then
    self.buf = data
    return ""
  end
  self.buf = sub(data, cut + 2)
  return self:events(sub(data, 1, cut + 1))
end

local USAGE = '^"usage"%s*:%s*{'

-- the first usage object at or after i (plain searches, the pattern only where one hits: a pattern tried
-- at every byte of a block costs several times more)
local function find_usage(block, i)
  while true do
    local j = find_quoted(block, 'usage"', i)
    if j == nil then return nil end
    if find(block, USAGE, j) == j then return j end
    i = j + 7
  end
end

-- For a usage chunk of our own: the events with content, counted as the ext_proc's meter counts them
-- (core/sse.py), on the same bytes, and the stream's id; not once the model server reported usage.
function Relay:count(block)
  if self.show and not self.reported then
    self.content = self.content + count_content(block)
    if self.id == nil then self:stream_ids(block) end
  end
end

-- A block of whole LF-framed events, in any of the SSE format's framings.
function Relay:events(block)
  local raw = block
  if not canonical(block) then
    block = canonicalize(block)
    if block == "" then
      self:count(raw)
      return ""
    end
  end
  return self:relay(block, raw)
end

-- A block of whole events, each one "data: " line (``raw``: as the model server framed them): the usage
-- where the interface wants it, the alias put in.
function Relay:relay(block, raw)
  local u = find_quoted(block, 'usage"', 1)
  if u ~= nil then
    local dropped = drop_null_usage(block, u)
    if dropped ~= block then block, u = dropped, 1 end
    local at = find_usage(block, u)
    if at ~= nil or self.held ~= nil then block = self:take_usage(block, at) end
  elseif self.held ~= nil then
    block = self:take_usage(block, nil)
  end
  self:count(raw)  -- (after the usage: a block that reports it needs no count)
  if self.show and not self.reported and find(block, "[DONE]", 1, true) then
    block = self:own_usage(block)
  end
  return self:rename(block)
end

-- The id and created of the stream's first event that has them (JSON tokens), for a usage chunk of our own.
function Relay:stream_ids(block)
  local _, e = find(block, '"id"%s*:%s*')
  if e == nil then return end
  local stop = skip_value(block, e + 1)
  if stop == nil then return end
  self.id = sub(block, e + 1, stop - 1)
  local _, c = find(block, '"created"%s*:%s*', stop)
  local cstop = c and skip_value(block, c + 1)
  if cstop then self.created = sub(block, c + 1, cstop - 1) end
end

-- The position of the "data: [DONE]" line in an LF-framed block, or nil.
local function done_at(block, from)
  local d = from
  while true do
    d = find(block, "data:", d, true)
    if d == nil then return nil end
    if (d == 1 or byte(block, d - 1) == 10) and find(block, "^data: ?%[DONE%]\n", d) then return d end
    d = d + 5
  end
end

-- The client asked for usage and the model server reported none by [DONE]: the usage the request is
-- billed (observer.outcome: the estimated input, one output token per event with content, estimated)
-- in a chunk of our own, the last before [DONE] as the interface's streaming rule 3 wants it.
function Relay:own_usage(block)
  local d = done_at(block, 1)
  if d == nil then return block end
  self.reported = true
  local p, c = self.prompt, self.content
  local event = string.format('data: {"id":%s,"object":"chat.completion.chunk","created":%s,"model":%s,'
    .. '"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,'
    .. '"cost_micro_pln":%s,"estimated":true}}\n\n',
    self.id or '"chatcmpl-usage"', self.created or "0", self.alias_token, p, c, p + c,
    cost_micro_pln(p, c, self.input_price, self.output_price))
  return sub(block, 1, d - 1) .. event .. sub(block, d)
end

-- Each event of the block that carries a usage object: the usage moved where the interface's streaming rule 3 wants
-- it, or taken out; the usage chunk of our own goes out last before [DONE].
function Relay:take_usage(block, at)
  local out, pos = {}, 1
  while at ~= nil do
    local start = at  -- the event's one line begins after the LF before it
    while start > pos and byte(block, start - 1) ~= 10 do start = start - 1 end
    local e = find(block, "\n\n", at, true)
    local stop = e and e + 1 or #block
    out[#out + 1] = sub(block, pos, start - 1)
    out[#out + 1] = self:usage_event(sub(block, start, stop))
    pos = stop + 1
    at = find_usage(block, pos)
  end
  if self.held ~= nil then
    local d = done_at(block, pos)
    if d ~= nil then
      out[#out + 1] = sub(block, pos, d - 1)
      out[#out + 1] = self.held
      pos, self.held = d, nil
    end
  end
  out[#out + 1] = sub(block, pos)
  return table.concat(out)
end

-- vLLM's own usage chunk as a whole event (ids without escapes, choices [], a usage of three whole
-- numbers, its place captured): what ``usage_event`` makes of it, told by one anchored pattern instead
-- of its JSON scanner
local VLLM_USAGE = '^data: {"id":"[^"\\]*","object":"chat%.completion%.chunk","created":%d+,"model":"[^"\\]*",'
  .. '"choices":%[%],"usage":(){"prompt_tokens":%d+,"[a-z_]+":%d+,"[a-z_]+":%d+}()}\n\n$'

function Relay:usage_event(event)
  local vllm, _, ua, ub = find(event, VLLM_USAGE)
  if vllm ~= nil then  -- the final report (any earlier one is stale), shown (when asked) priced
    self.held, self.reported = nil, true
    if not self.show then return "" end
    local usage = sub(event, ua, ub - 1)
    local prompt, completion = usage_tokens(usage)
    return sub(event, 1, ua - 1) .. self:priced(usage, prompt, completion) .. sub(event, ub)
  end
  local data = event_data(event)
  local m = data and items(data, 1, true)
  if m == nil then return event end
  local k, f = nil, {}
  for i, x in ipairs(m) do
    f[x[1]] = value(data, x)
    if x[1] == "usage" then k = i end
  end
  if k == nil then return event end
  -- a usage object billing cannot read (core/cost.py) is no usage: taken out like a stale one
  local prompt, completion = usage_tokens(f.usage)
  local valid = prompt ~= nil
  local choices = f.choices and items(f.choices, 1, false)
  if f.choices == nil or falsy(f.choices) then
    -- vLLM's and SGLang's own usage chunk, choices: []: the final report (any earlier one is stale),
    -- shown (when asked) with what the request is billed
    if not valid then return "" end
    self.held, self.reported = nil, true
    if not self.show then return "" end
    local u = m[k]
    return data_lines(sub(data, 1, u[3] - 1) .. self:priced(f.usage, prompt, completion) .. sub(data, u[4]))
  end
  -- llama.cpp's and TGI's usage on the finish chunk, LiteLLM's on a chunk with an empty choice, running
  -- usage on every chunk: the chunk goes on without it (a finish chunk's delta that says nothing new
  -- emptied), the usage (when asked) on a chunk of its own before [DONE], and a chunk left with nothing
  -- to say is dropped.
  self.reported = self.reported or valid
  local u = m[k]
  local rest
  if k > 1 then rest = sub(data, 1, m[k - 1][4] - 1) .. sub(data, u[4])
  elseif m[k + 1] ~= nil then rest = sub(data, 1, u[2] - 1) .. sub(data, m[k + 1][2])
  else rest = sub(data, 1, u[2] - 1) .. sub(data, u[4]) end
  if self.show and valid then
    self.held = data_lines('{"id":' .. (f.id or "null") .. ',"object":' .. (f.object or '"chat.completion.chunk"')
      .. ',"created":' .. (f.created or "null") .. ',"model":' .. (f.model or "null")
      .. ',"choices":[],"usage":' .. self:priced(f.usage, prompt, completion) .. "}")
  end
  if choices ~= nil then
    local nothing = true
    for _, c in ipairs(choices) do
      if not says_nothing(value(f.choices, c)) then nothing = false break end
    end
    if nothing then return "" end
  end
  return data_lines(empty_closing_deltas(rest))
end

function Relay:priced(usage, prompt, completion)
  return priced(usage, cost_micro_pln(prompt, completion, self.input_price, self.output_price))
end

-- a member of the x-gateway-stream header's JSON object, as its JSON text
local function ctx_field(ctx, name)
  local _, e = find(ctx, '"' .. name .. '":', 1, true)
  if e == nil then return nil end
  local stop = skip_value(ctx, e + 1)
  return stop and sub(ctx, e + 1, stop - 1)
end

sse_relay = {Relay = Relay, ctx_field = ctx_field, cost_micro_pln = cost_micro_pln}

function envoy_on_response(handle)
  local headers = handle:headers()
  local ctx = headers:get("x-gateway-stream")
  if ctx == nil then return end
  headers:remove("x-gateway-stream")
  local upstream, alias = ctx_field(ctx, "u"), ctx_field(ctx, "a")
  if upstream == nil or alias == nil then return end
  local relay = Relay.new(upstream, alias, ctx_field(ctx, "w") == "1", ctx_field(ctx, "p"), ctx_field(ctx, "i"),
    ctx_field(ctx, "x"))
  for chunk in handle:bodyChunks() do
    local n = chunk:length()
    if n > 0 then chunk:setBytes(relay:feed(chunk:getBytes(0, n))) end
  end
  -- the stream ended: how many chunks the common case took, for Envoy's access log (relay_chunks,
  -- relay_common)
  local meta = handle:streamInfo():dynamicMetadata()
  meta:set("gateway.relay", "chunks", relay.chunks)
  meta:set("gateway.relay", "common", relay.common)
end
