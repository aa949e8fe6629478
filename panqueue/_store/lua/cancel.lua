-- cancel: WAITING / DELAYED / BLOCKED -> CANCELLED at once (jobs that depended on it fail, and
-- its dependency edges go: see end_job in lib/finish.lua).
-- An ACTIVE job is marked (cx) and its worker is told over the notify channel, for the run
-- that holds the lock now (lib/cancel_request.lua); it ends CANCELLED when the handler stops
-- (fail.lua), when its worker gives it back (release.lua) or when its lock expires
-- (stalled.lua).
--
-- KEYS[1]  queue prefix
-- ARGV[1]  job id   ARGV[2] how many cancelled jobs the queue keeps (-1 = all) when no worker
--          has set its retention (meta kf, which wins: a producer cannot know a worker's
--          Retention.failed; panqueue/_store/ops/queue.py sends Retention's default)
-- ARGV[3]  the state the job must be in ('' or absent: any), for a bulk cancel that picked it
--          in that state (panqueue/_store/ops/select.py cancel_jobs)
-- Returns  the state the job was in (a final state, or one other than ARGV[3], is left
--          unchanged), or false when there is no such job.
-- Invariants: a job in a final state is never changed. A job that waits, is delayed or is blocked
--          ends CANCELLED in this step, and its dependents fail with it (end_job), so none waits
--          for it. An ACTIVE job is never ended here, only marked and told: the run that holds its
--          lock ends it, so no worker runs a job that is no longer ACTIVE.
--!include layout.lua
--!include waiting.lua
--!include finish.lua
--!include cancel_request.lua

local id = ARGV[1]
local jkey = job_key(id)
local state = redis.call('HGET', jkey, 's')
if not state then
  return false
end
if (ARGV[3] or '') ~= '' and state ~= ARGV[3] then
  return state  -- it moved on since it was picked: left as it is
end
if state == 'waiting' or state == 'delayed' or state == 'blocked' then
  local keep = tonumber(redis.call('HGET', K_META, 'kf') or ARGV[2])
  detach(jkey, id, state)
  end_job(jkey, id, 'cancelled', now_ms(), keep)
elseif state == 'active' then
  redis.call('HSET', jkey, 'cx', 1)
  tell_cancel(id, redis.call('HGET', jkey, 'tk') or '')
end
return state
