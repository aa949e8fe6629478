-- expire: the sweep of jobs past their deadline to start (add's expires=). Each one still
-- waiting, delayed (for its run time or a retry's backoff) or blocked ends CANCELLED with reason
-- "expired" and its dependents fail (lib/expiry.lua, end_job). Reads only due entries.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  limit per call
-- Returns  how many jobs expired
-- Invariants: a job that has started is never expired (a running job is not in the set, and
--          one found active is skipped); any number of workers may sweep at once: each job is
--          checked and ended in one step.
--!include layout.lua
--!include waiting.lua
--!include finish.lua
--!include expiry.lua

local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', K_EXPIRES, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local expired = 0
for _, id in ipairs(due) do
  local jkey = job_key(id)
  local f = redis.call('HMGET', jkey, 's', 'x')
  local state = f[1]
  if (state == 'waiting' or state == 'delayed' or state == 'blocked') and f[2]
      and tonumber(f[2]) <= now then
    detach(jkey, id, state)
    expire_job(jkey, id, now)
    expired = expired + 1
  else
    redis.call('ZREM', K_EXPIRES, id)  -- started, ended or gone since it was added
  end
end
return expired
