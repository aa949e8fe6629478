-- schedule_tick: a due schedule (schedule_set.lua) enqueues the jobs of its due ticks, as its
-- misfire policy says, and moves to its next run.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  name   ARGV[2] the server time (ms) the caller listed the due ticks at
-- ARGV[3]  the schedule's next run (ms) once these ticks are taken
-- ARGV[4]  misfire: 'skip' | 'once' | 'all'   ARGV[5] grace (ms)
-- ARGV[6]  data (msgpack)   ARGV[7] priority   ARGV[8] options (msgpack | '')
-- ARGV[9]  one character per due tick: '1' where the tick's job belongs in another partition
--          of the queue (the one its key, or else its id, routes it to), '0' where in this one
-- ARGV[10..] the due ticks (ms), oldest first; the first is the schedule's next run as the
--          caller saw it
-- Returns  {taken, {job id enqueued, ...}, {tick left to the caller, ...}}: taken 1 when this
--          call took the ticks, 0 when another worker did (the next run moved) or the server's
--          clock is behind ARGV[2] (the caller lists the ticks again). A tick left to the
--          caller runs, and its job belongs in another partition, which this script cannot
--          write: it is listed as pending in the schedule's hash ("pending", the ticks joined
--          by spaces) and in "schedules:pending", and the caller adds its job there under its
--          id, then clears it (schedule_done.lua); a worker that finds it pending later adds
--          it again (the same id: no second job).
-- Invariants: a tick is taken by exactly one call, however many workers race for it: the
--          schedule only advances from the run time the caller saw, and the tick's job id is
--          derived from the schedule and the tick time (a duplicate add is a no-op). A tick at
--          most grace late runs; a later one was missed: 'skip' runs none of them, 'once' the
--          first, 'all' each. The last tick that ran is kept ("last" in the schedule's hash,
--          which a changed definition keeps) and no tick at or before it runs again, so a
--          server clock that steps back cannot run a tick twice. A tick that runs is either
--          enqueued here or left pending in the same step: none is lost between the two.
--!include layout.lua
--!include settings.lua
--!include waiting.lua
--!include new_job.lua

local name = ARGV[1]
local score = redis.call('ZSCORE', K_SCHEDULES, name)
if not score or tonumber(score) ~= tonumber(ARGV[10]) then
  return {0}
end
local now = now_ms()
if now < tonumber(ARGV[2]) then
  -- The clock stepped back since the caller read it: ticks it listed may not be due, and the
  -- ones it left out as missed may not be.
  return {0}
end
local skey = schedule_key(name)
local last = tonumber(redis.call('HGET', skey, 'last') or '-1')
local misfire, late = ARGV[4], now - tonumber(ARGV[5])
local key = ''
if keyed() then
  key = 'schedule:' .. name  -- a keyed queue's ticks share one key per schedule
end
local before = claimable()
local enqueued, left = {}, {}
local ran_last = nil  -- the latest tick run by this call, as given (an exact integer string)
local ran_missed = false
for i = 10, #ARGV do
  local tick = tonumber(ARGV[i])
  local run = false
  if tick <= last then
    run = false  -- ran before the server's clock stepped back
  elseif tick >= late then
    run = true
  elseif misfire == 'all' or (misfire == 'once' and not ran_missed) then
    run, ran_missed = true, true
  end
  if run then
    if string.sub(ARGV[9], i - 9, i - 9) == '1' then
      left[#left + 1] = ARGV[i]
    else
      local id = 'schedule:' .. name .. ':' .. ARGV[i]
      local _, created = add_job(now, {id = id, data = ARGV[6], priority = tonumber(ARGV[7]),
        delay = 0, run_at = 0, options = ARGV[8], key = key, deps = {}, dedup = '', ttl = 0,
        strategy = ''})
      if created == 1 then
        enqueued[#enqueued + 1] = id
      end
    end
    ran_last = ARGV[i]
  end
end
redis.call('ZADD', K_SCHEDULES, ARGV[3], name)
if ran_last then
  redis.call('HSET', skey, 'last', ran_last)
end
if #left > 0 then
  local pending = redis.call('HGET', skey, 'pending')
  local ticks = table.concat(left, ' ')
  redis.call('HSET', skey, 'pending', pending and (pending .. ' ' .. ticks) or ticks)
  redis.call('ZADD', K_SCHEDULES_PENDING, 'NX', now, name)
end
wake_if_work_appeared(before)
return {1, enqueued, left}
