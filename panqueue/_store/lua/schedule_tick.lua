-- schedule_tick: a due run of a schedule (schedule_set.lua) enqueues its job and moves the
-- schedule to its next run.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  name   ARGV[2] expected run ms (the run time the caller saw)   ARGV[3] next run ms
-- ARGV[4]  job id   ARGV[5] data (msgpack)   ARGV[6] priority   ARGV[7] options (msgpack | '')
-- Returns  1 when this call enqueued the tick's job, 0 when another worker did (or the run is
--          not due yet by the server's clock)
-- Invariant: a tick is consumed by exactly one call, however many workers race for it: the
--          schedule only advances from the run time the caller saw, and the tick's job id is
--          derived from the schedule and the tick time (a duplicate add is a no-op).
--!include layout.lua
--!include waiting.lua
--!include new_job.lua

local name = ARGV[1]
local score = redis.call('ZSCORE', K_SCHEDULES, name)
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
  return 0
end
local now = now_ms()
if tonumber(ARGV[2]) > now then
  return 0  -- not due yet by the server's clock
end
redis.call('ZADD', K_SCHEDULES, ARGV[3], name)
local before = claimable()
local key = ''
if keyed() then
  key = 'schedule:' .. name  -- a keyed queue's ticks share one key per schedule
end
local _, created = add_job(now, {id = ARGV[4], data = ARGV[5], priority = tonumber(ARGV[6]),
  delay = 0, run_at = 0, options = ARGV[7], key = key, deps = {}, dedup = '', ttl = 0,
  strategy = ''})
wake_if_work_appeared(before)
return created
