-- schedule_set: create or change a repeatable job's schedule. Definitions live in
-- "sched:<name>" (HASH: def, the msgpack definition; last, the latest tick that ran, which a
-- changed definition keeps: schedule_tick.lua) and the next run of each in "schedules" (ZSET,
-- score = run time ms).
--
-- KEYS[1]  queue prefix
-- ARGV[1]  name   ARGV[2] definition (msgpack)   ARGV[3] first run ms
-- Returns  1 created or changed, 0 unchanged (the same definition is already scheduled: its
--          next run is left as it was)
-- Invariants: the definition and the next run are written together; "last" survives a change of the
--          definition, so a changed schedule never runs a tick again that already ran
--          (schedule_tick.lua).
--!include layout.lua

local name = ARGV[1]
local skey = schedule_key(name)
if redis.call('HGET', skey, 'def') == ARGV[2] and redis.call('ZSCORE', K_SCHEDULES, name) then
  return 0
end
redis.call('HSET', skey, 'def', ARGV[2])
redis.call('ZADD', K_SCHEDULES, ARGV[3], name)
return 1
