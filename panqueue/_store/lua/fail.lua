-- fail: an attempt failed. Retry (WAITING, or DELAYED by the backoff) while attempts remain,
-- else FAILED (the dead-letter set) with the error, reason and attempt history; jobs that
-- depended on it fail too. A job whose cancellation was requested ends CANCELLED instead.
-- Then claim the next jobs for the slot.
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
--!include layout.lua
--!include status.lua
--!include waiting.lua
--!include claim.lua
--!include finish.lua
--!include expiry.lua
--!include memo.lua

local early = resent_or_lock_lost(ARGV[11], ARGV[1], ARGV[2])
if early then
  return early
end
local id = ARGV[1]
local jkey = job_key(id)
local now = now_ms()
local keep = tonumber(ARGV[9])
local before = claimable()
leave_active(jkey, id)
local history = redis.call('HGET', jkey, 'h') or ''
redis.call('HSET', jkey, 'e', ARGV[3], 'h', history .. ARGV[4])
if ARGV[13] and ARGV[13] ~= '' then
  redis.call('HSET', jkey, 'o', ARGV[13])
end

local status
-- et, st: for its history record; x: a deadline to start by applies again to a retry
local job = redis.call('HMGET', jkey, 'a', 'et', 'st', 'x')
local attempts = tonumber(job[1])
if redis.call('HEXISTS', jkey, 'cx') == 1 then
  status = CANCELLED
  end_job(jkey, id, 'cancelled', now, keep, {seen = job, token = ARGV[2]})
elseif ARGV[7] == '1' or attempts >= tonumber(ARGV[5]) then
  status = FAILED
  local reason = ARGV[8]
  if reason == '' then
    reason = 'max_attempts_exceeded'
  end
  end_job(jkey, id, 'failed', now, keep, {error = ARGV[3], reason = reason, seen = job,
    token = ARGV[2]})
else
  local delay = tonumber(ARGV[6])
  if delay > 0 then
    status = RETRY_DELAYED
    rearm_expiry(id, job[4])
    redis.call('HSET', jkey, 's', 'delayed')
    redis.call('ZADD', K_DELAYED, now + delay, id)
    emit('retried', id, 's', 'delayed', 'a', attempts)
    local first = redis.call('ZRANGE', K_DELAYED, 0, 0)
    if first[1] == id then
      wake_workers()
    end
  else
    status = RETRY_NOW
    rearm_expiry(id, job[4])
    enqueue_waiting(jkey, id)
    emit('retried', id, 's', 'waiting', 'a', attempts)
  end
end
local reply = {status}
claim(now, ARGV[11], tonumber(ARGV[12]), tonumber(ARGV[10]), reply)
wake_if_work_appeared(before)
remember(ARGV[11], reply, 2, tonumber(ARGV[12]))
return reply
