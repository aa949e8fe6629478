-- clean: age-based retention. Deletes finished jobs (completed; failed and cancelled) that
-- finished more than the given age ago, with their dependency edges (delete_job). Count-based
-- retention happens on every finish.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  max age of completed jobs ms (-1: no limit)   ARGV[2] of failed/cancelled jobs
-- ARGV[3]  limit per set per call
-- Returns  how many jobs were deleted
-- Invariants: only finished jobs are deleted, each with its dependency edges (delete_job:
--          dependents still blocked on it fail); a job's age is the server's time since it finished
--          (its score in the set).
--!include layout.lua
--!include finish.lua

local now = now_ms()
local removed = 0
local function clean(set, age)
  if age < 0 then
    return
  end
  local old = redis.call('ZRANGEBYSCORE', set, '-inf', now - age, 'LIMIT', 0, tonumber(ARGV[3]))
  for _, id in ipairs(old) do
    delete_job(id, now, false, true)
  end
  if #old > 0 then
    redis.call('ZREM', set, unpack(old))
  end
  removed = removed + #old
end
clean(K_COMPLETED, tonumber(ARGV[1]))
clean(K_FAILED, tonumber(ARGV[2]))
clean(K_CANCELLED, tonumber(ARGV[2]))
return removed
