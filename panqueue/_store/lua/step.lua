-- step: a running durable job finished a step (job.step): its result is stored with the job,
-- so that every later run of the job returns it instead of running the step again.
--
-- A durable job's record, "job:<id>:durable" (HASH; deleted with the job):
--   s:<name> a step's result (msgpack)   t:<name> "<order>:<ms>" when it was stored   n steps
--   z:<k> the wake time of the run's k-th sleep (ms)   zp:<k> the server found it passed
--   wd:<k> the deadline of the run's k-th wait for a signal (ms)   ws the signal waited for now
--   w:<k> what the k-th wait got: "1" .. payload (msgpack), or "0" (timed out)   wn:<k> its name
--   q:<name> the signals of that name kept for a later wait (msgpack array, oldest first)
--
-- KEYS[1]  queue prefix
-- ARGV[1]  job id   ARGV[2] lock token   ARGV[3] step name   ARGV[4] result (msgpack)
-- Returns  1, or 0 when the lock is lost (nothing written)
-- Invariants: only the holder of the job's lock stores a step (a run that lost its lock
--          writes nothing); a stored step is never replaced.
--!include layout.lua

local id = ARGV[1]
if redis.call('HGET', job_key(id), 'tk') ~= ARGV[2] then
  return 0
end
local dkey = durable_key(id)
local name = ARGV[3]
if redis.call('HEXISTS', dkey, 's:' .. name) == 1 then
  return 1
end
local order = redis.call('HINCRBY', dkey, 'n', 1)
redis.call('HSET', dkey, 's:' .. name, ARGV[4], 't:' .. name, order .. ':' .. now_ms())
return 1
