-- snooze: the handler asked to run the job again later (Snooze): ACTIVE -> DELAYED for the
-- requested time (WAITING at the back of its priority when that is 0), without using an
-- attempt: the attempt count the claim raised goes back down, and the snooze is counted (sn)
-- and recorded in the history instead. A job that snoozes more than max snoozes times ends
-- FAILED (max_snoozes_exceeded, this run counted as its attempt); a job whose cancellation was
-- requested ends CANCELLED. Then claim the next jobs for the slot.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  job id   ARGV[2] lock token   ARGV[3] delay ms (0 .. 2^52)
-- ARGV[4]  history entry (msgpack)   ARGV[5] max snoozes (-1 = no limit)
-- ARGV[6]  keep failed (-1 = all)   ARGV[7] claim n   ARGV[8] new lock token (fresh for this
--          call: also its request id, see lib/memo.lua)   ARGV[9] lock ttl ms
-- Returns  {status, count, wake_in, jobs...}; status (lib/status.lua) SNOOZED, FAILED or
--          CANCELLED; or {LOCK_LOST} when the token does not match (nothing changed). A resent
--          call answers as the first one did and changes nothing.
-- Invariants: only the holder of the lock snoozes a job; a snooze never changes how many
--          attempts the job has left.
--!include layout.lua
--!include status.lua
--!include waiting.lua
--!include claim.lua
--!include finish.lua
--!include expiry.lua
--!include memo.lua

local early = resent_or_lock_lost(ARGV[8], ARGV[1], ARGV[2])
if early then
  return early
end
local id = ARGV[1]
local jkey = job_key(id)
local now = now_ms()
local keep = tonumber(ARGV[6])
local max_snoozes = tonumber(ARGV[5])
local before = claimable()
leave_active(jkey, id)
local snoozes = redis.call('HINCRBY', jkey, 'sn', 1)
redis.call('HSET', jkey, 'h', (redis.call('HGET', jkey, 'h') or '') .. ARGV[4])

local status
if redis.call('HEXISTS', jkey, 'cx') == 1 then
  status = CANCELLED
  end_job(jkey, id, 'cancelled', now, keep)
elseif max_snoozes >= 0 and snoozes > max_snoozes then
  status = FAILED
  local err = cmsgpack.pack({type = 'MaxSnoozesExceeded', message = 'snoozed ' .. snoozes
    .. ' times; the handler allows at most ' .. max_snoozes .. ' (max_snoozes)'})
  end_job(jkey, id, 'failed', now, keep, {error = err, reason = 'max_snoozes_exceeded'})
else
  status = SNOOZED
  local attempts = redis.call('HINCRBY', jkey, 'a', -1)
  rearm_expiry(id, redis.call('HGET', jkey, 'x'))
  local delay = tonumber(ARGV[3])
  if delay > 0 then
    redis.call('HSET', jkey, 's', 'delayed')
    redis.call('ZADD', K_DELAYED, now + delay, id)
    emit('snoozed', id, 's', 'delayed', 'a', attempts)
    local first = redis.call('ZRANGE', K_DELAYED, 0, 0)
    if first[1] == id then
      wake_workers()  -- idle workers sleep until the earliest delayed job
    end
  else
    enqueue_waiting(jkey, id)
    emit('snoozed', id, 's', 'waiting', 'a', attempts)
  end
end
local reply = {status}
claim(now, ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[7]), reply)
wake_if_work_appeared(before)
remember(ARGV[8], reply, 2, tonumber(ARGV[9]))
return reply
