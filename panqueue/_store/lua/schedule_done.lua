-- schedule_done: the jobs of ticks a schedule left pending (schedule_tick.lua: their jobs
-- belong in other partitions) were added there: those ticks are pending no more.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  name   ARGV[2..] the ticks (ms) whose jobs were added
-- Returns  how many of the schedule's ticks are still pending
-- Invariants: only the ticks named stop being pending (ticks taken since stay); a schedule
--          with none pending is not in "schedules:pending". A resent call changes nothing more.
--!include layout.lua

local name = ARGV[1]
local skey = schedule_key(name)
local added = {}
for i = 2, #ARGV do
  added[ARGV[i]] = true
end
local left = {}
for tick in string.gmatch(redis.call('HGET', skey, 'pending') or '', '%S+') do
  if not added[tick] then
    left[#left + 1] = tick
  end
end
if #left == 0 then
  redis.call('HDEL', skey, 'pending')
  redis.call('ZREM', K_SCHEDULES_PENDING, name)
else
  redis.call('HSET', skey, 'pending', table.concat(left, ' '))
end
return #left
