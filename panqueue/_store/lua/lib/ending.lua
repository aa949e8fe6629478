-- lib/ending.lua: an attempt that ends without completing its job, whichever way it ends:
-- failed (fail.lua), snoozed (snooze.lua), refused for now by an outside service
-- (rate_limited.lua). Each of those scripts decides what its ending does to the job; the steps
-- they share are written here, once, in the order a script takes them:
--   open_ending       a resent call answers as the first one did, a lost lock LOCK_LOST;
--   leave_with_entry  the job leaves ACTIVE, its attempt's entry added to its history (h);
--   cancel_heard      a job whose cancellation was requested ends CANCELLED, whatever the
--                     handler did;
--   end_failed        the job ends FAILED, for good;
--   give_back         the attempt the claim counted is given back (it used none);
--   run_again         the job waits again: DELAYED (with a wake-up) or WAITING;
--   ending_reply      the slot's next jobs claimed, idle workers woken, the reply remembered.
-- Invariant: whatever ends the job here ends it through end_job with the attempt's lock token,
-- so its history record names the worker that ran it (lib/records.lua).
-- Needs: layout.lua, settings.lua (emit), status.lua, waiting.lua, active.lua, claim.lua, finish.lua, expiry.lua, memo.lua.
--!include layout.lua
--!include settings.lua
--!include status.lua
--!include waiting.lua
--!include active.lua
--!include claim.lua
--!include finish.lua
--!include expiry.lua
--!include memo.lua

-- `at`: {id, token (the attempt's lock token), request (the call's fresh lock token, also its
-- request id: lib/memo.lua), keep (how many jobs the finished set of an ending keeps, -1 all),
-- claim_n, ttl (of the next jobs' locks, ms)}, from the script's ARGV. Returns the early reply,
-- or nil and `at` completed with what every step reads: jkey, now, before (claimable units,
-- for the wake-up of ending_reply).
local function open_ending(at)
  local early = resent_or_lock_lost(at.request, at.id, at.token)
  if early then
    return early
  end
  at.jkey = job_key(at.id)
  at.now = now_ms()
  at.before = claimable()
  return nil, at
end

-- The job stops running, and `entry` (msgpack) joins its attempt history; `...`: more job
-- fields to set in the same write, as name, value pairs.
local function leave_with_entry(at, entry, ...)
  leave_active(at.jkey, at.id)
  local history = redis.call('HGET', at.jkey, 'h') or ''
  redis.call('HSET', at.jkey, 'h', history .. entry, ...)
end

-- Whether cancel() was called for the job while the attempt ran (lib/cancel_request.lua): if
-- so it ends CANCELLED now. `seen`: as end_job's how.seen (nil: end_job reads them).
local function cancel_heard(at, seen)
  if redis.call('HEXISTS', at.jkey, 'cx') == 0 then
    return false
  end
  end_job(at.jkey, at.id, 'cancelled', at.now, at.keep, {seen = seen, token = at.token})
  return true
end

-- The job ends FAILED with `error` (msgpack {type, message, traceback}) and `reason`.
local function end_failed(at, error, reason, seen)
  end_job(at.jkey, at.id, 'failed', at.now, at.keep,
    {error = error, reason = reason, seen = seen, token = at.token})
end

-- The attempt the claim counted did not use one: the count goes back down. Returns it.
local function give_back(at)
  return redis.call('HINCRBY', at.jkey, 'a', -1)
end

-- The job runs again (`attempts`: its attempt count now): its deadline to start by (`x`, nil
-- for none) applies again; it is DELAYED for `delay` ms, or at 0 WAITING behind the others of
-- its priority, and `event` says which. Idle workers sleep until the earliest delayed job:
-- they are woken when this one is now the earliest. A durable job's mark of the signal it
-- waits for (ws, suspend.lua) goes: it held for the suspension that set it, which this run
-- left (by the wait's timeout, or by a promotion), and this wait is not one for a signal
-- unless suspend.lua marks it so after this call.
local function run_again(at, event, attempts, x, delay)
  rearm_expiry(at.id, x)
  redis.call('HDEL', durable_key(at.id), 'ws')
  if delay > 0 then
    redis.call('HSET', at.jkey, 's', 'delayed')
    redis.call('ZADD', K_DELAYED, at.now + delay, at.id)
    emit(event, at.id, 's', 'delayed', 'a', attempts)
    if redis.call('ZRANGE', K_DELAYED, 0, 0)[1] == at.id then
      wake_workers()
    end
  else
    enqueue_waiting(at.jkey, at.id, nil, at.now)
    emit(event, at.id, 's', 'waiting', 'a', attempts)
  end
end

-- The reply {status, count, wake_in, jobs...}: the slot's next jobs claimed (at.claim_n),
-- idle workers woken if the ending made work claimable, and the reply remembered for a resend.
local function ending_reply(at, status)
  local reply = {status}
  claim(at.now, at.request, at.ttl, at.claim_n, reply)
  wake_if_work_appeared(at.before)
  remember(at.request, reply, 2, at.ttl)
  return reply
end
