-- fail: an attempt failed. Retry (WAITING, or DELAYED by the backoff) while attempts remain,
-- else FAILED (the dead-letter set) with the error, reason and attempt history; jobs that
-- depended on it fail too. A job whose cancellation was requested ends CANCELLED instead.
-- Then claim the next jobs for the slot. The steps are those of every ending of an attempt
-- (lib/ending.lua).
--
-- KEYS[1]  queue prefix
-- ARGV[1]  job id   ARGV[2] lock token   ARGV[3] error (msgpack {type, message, traceback})
-- ARGV[4]  history entry (msgpack)   ARGV[5] max attempts   ARGV[6] retry delay ms
-- ARGV[7]  final (1: never retry)    ARGV[8] reason if this ends the job ('' = attempts ran out)
-- ARGV[9]  keep failed (-1 = all)    ARGV[10] claim n   ARGV[11] new lock token (fresh for
--          this call: also its request id, see lib/memo.lua)
-- ARGV[12] lock ttl ms   ARGV[13] the job's options from now on (msgpack; '' or absent: kept as
--          they are). Only a traced worker sends them, with this attempt's span context, for
--          the next attempt's span to link to (panqueue/_tracing.py).
-- Returns  {status, count, wake_in, jobs...}; status (lib/status.lua) RETRY_NOW, RETRY_DELAYED,
--          FAILED or CANCELLED; or {LOCK_LOST} when the token does not match (nothing
--          changed). A resent call answers as the first one did and changes nothing.
-- Invariants: only the holder of the lock fails a job; a failed attempt keeps the attempt the
--          claim counted (a snooze or a rate limit gives it back); the error is kept with the
--          job whichever way it goes on.
--!include ending.lua

local early, at = open_ending({id = ARGV[1], token = ARGV[2], request = ARGV[11],
  keep = tonumber(ARGV[9]), claim_n = tonumber(ARGV[10]), ttl = tonumber(ARGV[12])})
if early then
  return early
end
if ARGV[13] and ARGV[13] ~= '' then
  leave_with_entry(at, ARGV[4], 'e', ARGV[3], 'o', ARGV[13])
else
  leave_with_entry(at, ARGV[4], 'e', ARGV[3])
end

local status
-- et, st: for its history record; x: a deadline to start by applies again to a retry
local job = redis.call('HMGET', at.jkey, 'a', 'et', 'st', 'x')
local attempts = tonumber(job[1])
if cancel_heard(at, job) then
  status = CANCELLED
elseif ARGV[7] == '1' or attempts >= tonumber(ARGV[5]) then
  status = FAILED
  local reason = ARGV[8]
  if reason == '' then
    reason = 'max_attempts_exceeded'
  end
  end_failed(at, ARGV[3], reason, job)
else
  local delay = tonumber(ARGV[6])
  status = delay > 0 and RETRY_DELAYED or RETRY_NOW
  run_again(at, 'retried', attempts, job[4], delay)
end
return ending_reply(at, status)
