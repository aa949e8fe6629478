#!lua flags=allow-oom
-- extend: renew the locks of a worker's running jobs (one call for all of them).
--
-- KEYS[1]  queue prefix
-- ARGV[1]  lock ttl ms   ARGV[2..] pairs: job id, lock token
-- Returns  the locks that are lost, as job id, token pairs (flat): the job's token no longer
--          matches (the lock expired and the job was taken away); their deadlines are untouched.
--          A lock is the pair: the jobs one claim took share its token, and one worker may
--          hold a lost attempt and a new attempt of the same job at once.
-- Invariant: a lock is only ever extended by the holder of its current token.
-- Runs under maxmemory (allow-oom): renewing a lock only rewrites a score, and a worker that
--          cannot renew while Redis is full would see all its jobs swept as stalled.
--!include layout.lua

local now = now_ms()
local deadline = now + tonumber(ARGV[1])
local lost = {}
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', job_key(id), 'tk') == ARGV[i + 1] then
    redis.call('ZADD', K_ACTIVE, 'XX', deadline, id)
  else
    lost[#lost + 1] = id
    lost[#lost + 1] = ARGV[i + 1]
  end
end
return lost
