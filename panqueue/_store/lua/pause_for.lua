-- pause_for: a handler of a partitioned global-mode queue raised RateLimited in one partition
-- (rate_limited.lua paused that one): each other partition takes no new job for as long
-- either. Like the pause rate_limited.lua sets, it only ever grows; resume ends it.
--
-- KEYS[1]  queue prefix (one partition)
-- ARGV[1]  ms from now (this partition's server clock)
-- Returns  the time the partition is paused until (ms)
-- Invariants: a pause only ever grows (a shorter one leaves a longer one as it is); the partition's
--          own clock decides when it ends.
--!include layout.lua
--!include settings.lua

local until_ms = now_ms() + tonumber(ARGV[1])
local current = tonumber(meta().paused_until or '0')
if current < until_ms then
  redis.call('HSET', K_META, 'pu', until_ms)
  return until_ms
end
return current
