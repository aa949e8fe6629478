#!lua flags=allow-oom
-- release: a worker gives jobs back (forced shutdown): ACTIVE -> WAITING at the front, at once
-- rather than after the lock expires. The interrupted attempt does not count. A job whose
-- cancellation was requested ends CANCELLED instead (keeping every cancelled job).
--
-- KEYS[1]  queue prefix
-- ARGV[1..] pairs: job id, lock token
-- Returns  how many jobs were released (a job whose token no longer matches is left alone).
-- Invariants: only the holder of a lock gives its job back; the interrupted attempt does not count
--          (the attempt count goes back down), the job goes back to the front of its priority (a
--          priority other than the default: to its old place in the wait order; requeue_waiting),
--          the jobs given back in the order of ARGV, and its deadline to start by applies again
--          (rearm_expiry).
--!include layout.lua
--!include settings.lua
--!include waiting.lua
--!include active.lua
--!include finish.lua
--!include expiry.lua

local released = 0
local before = claimable()
-- From the last pair to the first: each goes to the front, so the first given stays first.
for i = #ARGV - 1, 1, -2 do
  local id = ARGV[i]
  local jkey = job_key(id)
  if redis.call('HGET', jkey, 'tk') == ARGV[i + 1] then
    leave_active(jkey, id)
    if redis.call('HEXISTS', jkey, 'cx') == 1 then
      -- cancellation was requested: honour it
      end_job(jkey, id, 'cancelled', now_ms(), -1, {token = ARGV[i + 1]})
    else
      redis.call('HINCRBY', jkey, 'a', -1)
      rearm_expiry(id, redis.call('HGET', jkey, 'x'))
      requeue_waiting(jkey, id)
      emit('waiting', id, 'why', 'released')
    end
    released = released + 1
  end
end
wake_if_work_appeared(before)
return released
