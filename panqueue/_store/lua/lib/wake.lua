-- lib/wake.lua: waking idle workers when claimable work appears (SPUBLISH "w" on the queue's
-- notify channel; their waits, panqueue/_runtime/wakeups.py).
-- Needs: settings.lua.
--!include settings.lua

-- How many claimable units there are (jobs in global mode, ready keys in keyed mode). Idle
-- workers are woken when this goes from zero to non-zero: a worker goes idle only after a claim
-- found nothing, so the change after that is always announced (see docs/concepts.md).
local function claimable()
  if keyed() then
    return redis.call('ZCARD', K_READY)
  end
  return redis.call('ZCARD', K_WAIT) + redis.call('LLEN', K_WAIT_LIST)
end

local function wake_workers()
  redis.call('SPUBLISH', K_NOTIFY, 'w')
end

-- `before`: claimable() before the script's change; `now_count`, when given: claimable() now
-- (counted since the last change), else it is counted here.
local function wake_if_work_appeared(before, now_count)
  if before == 0 and (now_count or claimable()) > 0 then
    wake_workers()
  end
end
