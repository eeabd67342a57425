-- wrk script: every request labelled with a tier by the mix 10/20/30/40 % (Critical, High,
-- Medium, Sheddable) in `triage-criticality`, paced by delay() so that the offered rate is set
-- by connections / delay rather than by how fast the server answers (wrk is closed-loop).
-- Counts answers per tier and status, read from the answer itself: the served answer echoes
-- the tier in `triage-criticality`, a refusal names it in its JSON body.
--
-- wrk -t2 -c400 -d20s -s mix.lua http://127.0.0.1:8080/work -- <delay_ms> [critical-only]

local tiers = { "critical", "high", "medium", "sheddable" }
local cumulative = { 10, 30, 60, 100 }
local threads = {}
local delay_ms = 0
local only = nil

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  delay_ms = tonumber(args[1] or "0")
  only = args[2]
  counts = {}
  for _, t in ipairs(tiers) do
    counts[t .. "_200"] = 0
    counts[t .. "_503"] = 0
    counts[t .. "_429"] = 0
    counts[t .. "_other"] = 0
  end
  counts["unknown"] = 0
  math.randomseed(os.time() + math.floor(os.clock() * 1e6))
end

function delay()
  return delay_ms
end

function request()
  local tier = only
  if tier == nil then
    local r = math.random(100)
    for i, c in ipairs(cumulative) do
      if r <= c then tier = tiers[i]; break end
    end
  end
  wrk.headers["triage-criticality"] = tier
  return wrk.format("GET")
end

function response(status, headers, body)
  local tier = headers["triage-criticality"] or headers["Triage-Criticality"]
  if tier == nil and body ~= nil then
    tier = string.match(body, '"tier":"(%a+)"')
  end
  if tier == nil or counts[tier .. "_200"] == nil then
    counts["unknown"] = counts["unknown"] + 1
    return
  end
  local key = tier .. "_" .. tostring(status)
  if counts[key] == nil then key = tier .. "_other" end
  counts[key] = counts[key] + 1
end

function done(summary, latency, requests)
  local total = {}
  for _, thread in ipairs(threads) do
    local c = thread:get("counts")
    for k, v in pairs(c) do total[k] = (total[k] or 0) + v end
  end
  io.write("per tier (wrk's view): 200 / 503 / 429 / other\n")
  for _, t in ipairs(tiers) do
    local ok, s5, s4, o = total[t .. "_200"] or 0, total[t .. "_503"] or 0, total[t .. "_429"] or 0, total[t .. "_other"] or 0
    local all = ok + s5 + s4 + o
    local pct = 0
    if all > 0 then pct = 100 * ok / all end
    io.write(string.format("%-9s %8d %8d %8d %8d  (%.2f%% served)\n", t, ok, s5, s4, o, pct))
  end
  io.write(string.format("unknown %d\n", total["unknown"] or 0))
  io.write(string.format("latency (all answers, client side) p50 %.2f ms p99 %.2f ms\n",
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
