-- schedule_remove: delete a schedule (schedule_set.lua); jobs it already enqueued stay.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  name
-- Returns  1 removed, 0 no such schedule
-- Invariants: a schedule's definition and its next run go together; the jobs it enqueued are not
--          touched; ticks it left pending (schedule_tick.lua) go with it.
--!include layout.lua

local name = ARGV[1]
redis.call('DEL', schedule_key(name))  -- its pending ticks with it: they run no more
redis.call('ZREM', K_SCHEDULES_PENDING, name)
return redis.call('ZREM', K_SCHEDULES, name)
