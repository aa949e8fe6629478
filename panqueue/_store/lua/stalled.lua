-- stalled: the sweep. Active jobs whose lock deadline has passed (their worker died or hung)
-- go back to WAITING at the front, or to FAILED with reason "stalled" once they have stalled
-- more than the allowed number of times (or CANCELLED, if that was requested). Reads only
-- past-deadline members.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  max stalls   ARGV[2] limit per call   ARGV[3] keep failed   ARGV[4] error (msgpack)
-- Returns  {requeued, failed} (failed counts the jobs that ended CANCELLED too)
-- Invariant: any number of workers may sweep at once; each move is check-and-move, so a job
--          is requeued at most once per expiry. A stalled attempt does not count as an attempt.
--!include layout.lua
--!include settings.lua
--!include waiting.lua
--!include active.lua
--!include finish.lua
--!include expiry.lua

local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', K_ACTIVE, '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local keep = tonumber(ARGV[3])
local requeued, failed = 0, 0
local before = claimable()
-- From the last to the first: each goes to the front of its list, so the jobs whose locks ran
-- out first stay first.
for i = #expired, 1, -1 do
  local id = expired[i]
  local jkey = job_key(id)
  -- Read before leave_active drops the lock token: whose attempt stalled (history record).
  local job = redis.call('HMGET', jkey, 'a', 'et', 'st', 'tk', 'x')
  if job[2] then  -- every job hash has et (enqueued at)
    leave_active(jkey, id)
    local stalls = redis.call('HINCRBY', jkey, 'sc', 1)
    local attempt = tonumber(job[1])
    local started = tonumber(job[3] or now)
    local entry = cmsgpack.pack({attempt = attempt, type = 'Stalled',
      message = 'lock expired (worker lost or blocked)', duration_ms = now - started})
    redis.call('HSET', jkey, 'h', (redis.call('HGET', jkey, 'h') or '') .. entry)
    if redis.call('HEXISTS', jkey, 'cx') == 1 then
      -- Its cancellation was requested and its worker is gone: it ends cancelled, not re-run.
      end_job(jkey, id, 'cancelled', now, keep, {seen = job, token = job[4] or nil})
      failed = failed + 1
    elseif stalls > tonumber(ARGV[1]) then
      end_job(jkey, id, 'failed', now, keep, {error = ARGV[4], reason = 'stalled', seen = job,
        token = job[4] or nil})
      failed = failed + 1
    else
      redis.call('HINCRBY', jkey, 'a', -1)
      rearm_expiry(id, job[5])
      requeue_waiting(jkey, id)
      emit('stalled', id)
      requeued = requeued + 1
    end
  else
    redis.call('ZREM', K_ACTIVE, id)
  end
end
wake_if_work_appeared(before)
return {requeued, failed}
