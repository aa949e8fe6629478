-- lib/activate.lua: WAITING -> ACTIVE of one job the claim took out of waiting: its lock, its
-- attempt, and its deadline to start by (a job past it is ended instead of started).
-- Needs: layout.lua, settings.lua (emit), expiry.lua, job_data.lua.
--!include layout.lua
--!include settings.lua
--!include expiry.lua
--!include job_data.lua

-- The jobs activated by the claim under way and their lock deadlines, as ZADD's score-member
-- pairs: lock_activated() adds them to the active set in one command when the claim is done.
local ACTIVATED = {}

-- WAITING -> ACTIVE with the lock token and a lock deadline, in one step (a sweeper can never
-- see a job that is claimed but not yet locked: the claim calls lock_activated() before its
-- script returns). `ws`: its place in the wait set (global mode), kept with it for a requeue. Appends the job to `out` and returns true; or, when the job is
-- past its deadline to start (x), ends it CANCELLED "expired" and returns false.
-- The attempt is appended as a number, or as a string when the job never ran before (it has no
-- start time yet, st): no run can have written its durable record, so a durable handler need
-- not read it (panqueue/_durable.py). A reader of another version takes either as the number.
local function activate(id, now, token, ttl, out, ws)
  local jkey = job_key(id)
  local f = redis.call('HMGET', jkey, 'et', 'o', 'a', 'x', 'st', 'd', 'd1')
  if f[4] then
    if tonumber(f[4]) <= now then
      expire_job(jkey, id, now)
      return false
    end
    redis.call('ZREM', K_EXPIRES, id)  -- started in time: it cannot expire while it runs
  end
  local attempt = tonumber(f[3] or '0') + 1
  local a = int_arg(attempt)
  if ws then
    redis.call('HSET', jkey, 's', 'active', 'st', int_arg(now), 'tk', token, 'a', a, 'ws', ws)
  else
    redis.call('HSET', jkey, 's', 'active', 'st', int_arg(now), 'tk', token, 'a', a)
  end
  ACTIVATED[#ACTIVATED + 1] = int_arg(now + ttl)
  ACTIVATED[#ACTIVATED + 1] = id
  out[#out + 1] = id
  out[#out + 1] = job_data(jkey, f[6], f[7])
  if f[5] then
    out[#out + 1] = attempt
  else
    out[#out + 1] = a  -- its first run (the attempt as text): no durable record of its own
  end
  out[#out + 1] = f[1]
  out[#out + 1] = f[2] or ''
  emit('active', id, 'a', a)
  return true
end

-- The claim is done: the jobs it activated enter the active set, with their lock deadlines.
local function lock_activated()
  if #ACTIVATED > 0 then
    call_sliced(ACTIVATED, 'ZADD', K_ACTIVE)
    ACTIVATED = {}
  end
end
