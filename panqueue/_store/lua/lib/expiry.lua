-- lib/expiry.lua: deadlines to start by (add's expires=). A job that has not started by its
-- deadline ends CANCELLED with reason "expired" and never runs: every claim checks the deadline
-- of the jobs it takes (lib/claim.lua), and expire.lua sweeps the jobs that wait past theirs.
-- Needs: layout.lua, settings.lua, finish.lua.
--
-- The deadline is the job hash's field x (ms, server clock). ZSET "expires" holds the jobs that
-- may still expire, scored by their deadline: a job leaves it when it starts (the claim read x
-- anyway) and goes back when it waits again after running (a retry, a stall, a release, a
-- snooze, a rate-limited run: rearm_expiry). An entry whose job ended or went otherwise (cancel,
-- remove, retention) is dropped by the sweep once due, so no other path pays for it.
--!include layout.lua
--!include settings.lua
--!include finish.lua

-- Job `id`, taken out of the set it waited in by the caller, is past its deadline: it ends
-- CANCELLED with reason "expired" (its dependents fail, end_job).
local function expire_job(jkey, id, now)
  redis.call('ZREM', K_EXPIRES, id)
  end_job(jkey, id, 'cancelled', now, cancelled_keep(), {reason = 'expired'})
end

-- A job that ran waits again: its deadline `x` (the job's field, nil for none) applies again.
local function rearm_expiry(id, x)
  if x then
    redis.call('ZADD', K_EXPIRES, x, id)
  end
end

-- A new job's deadline to start by (ms), or nil: absolute (`expires_at`), or `expires_in` ms
-- from `now` on the server's clock (0 or nil: none).
local function start_deadline(now, expires_in, expires_at)
  if expires_at and expires_at ~= 0 then
    return expires_at
  elseif expires_in and expires_in > 0 then
    return now + expires_in
  end
  return nil
end
