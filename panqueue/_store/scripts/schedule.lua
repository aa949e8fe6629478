--!include _lib.lua
-- schedule: repeatable jobs. Definitions live in {q:X}:sched:<name> (HASH: def, the msgpack
-- definition) and the next run of each in {q:X}:schedules (ZSET, score = run time ms).
--
-- KEYS[1]  queue prefix
-- ARGV[1]  'set'    name, definition, first run ms   -> 1 created/changed, 0 unchanged
--          'tick'   name, expected run ms, next run ms, job id, data, priority, options
--                   -> 1 when this call enqueued the tick's job, 0 when another worker did
--          'remove' name                              -> 1 removed, 0 no such schedule
-- Invariant: a tick is consumed by exactly one call, however many workers race for it: the
--          schedule only advances from the run time the caller saw, and the tick's job id is
--          derived from the schedule and the tick time (a duplicate add is a no-op).
local K_SCHEDULES = P .. 'schedules'
local op, name = ARGV[1], ARGV[2]
local skey = P .. 'sched:' .. name
if op == 'set' then
  if redis.call('HGET', skey, 'def') == ARGV[3] and redis.call('ZSCORE', K_SCHEDULES, name) then
    return 0
  end
  redis.call('HSET', skey, 'def', ARGV[3])
  redis.call('ZADD', K_SCHEDULES, ARGV[4], name)
  return 1
elseif op == 'tick' then
  local score = redis.call('ZSCORE', K_SCHEDULES, name)
  if not score or tonumber(score) ~= tonumber(ARGV[3]) then
    return 0
  end
  local now = now_ms()
  if tonumber(ARGV[3]) > now then
    return 0  -- not due yet by the server's clock
  end
  redis.call('ZADD', K_SCHEDULES, ARGV[4], name)
  local before = claimable()
  local key = ''
  if keyed() then
    key = 'schedule:' .. name  -- a keyed queue's ticks share one key per schedule
  end
  local _, created = add_job(now, {id = ARGV[5], data = ARGV[6], priority = tonumber(ARGV[7]),
    delay = 0, run_at = 0, options = ARGV[8], key = key, deps = {}, dedup = '', ttl = 0,
    strategy = ''})
  wake_if_work_appeared(before)
  return created
elseif op == 'remove' then
  redis.call('DEL', skey)
  return redis.call('ZREM', K_SCHEDULES, name)
end
return redis.error_reply('unknown schedule operation ' .. tostring(op))
