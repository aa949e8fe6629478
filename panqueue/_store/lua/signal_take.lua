-- signal_take: a running durable job waits for a signal (job.wait_for) that its record does
-- not answer yet: take the oldest signal of that name kept for it, or find the wait's deadline
-- passed. Either is recorded as what the run's k-th wait got, so a later run replays it.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  job id   ARGV[2] lock token   ARGV[3] the wait's order in the run (k)
-- ARGV[4]  signal name
-- Returns  {1, payload (msgpack)}: a signal taken; {2}: the wait timed out; {0}: nothing yet
--          (the worker then ends the attempt with suspend.lua); {-1}: the lock is lost
--          (nothing written).
-- Invariants: only the holder of the lock takes a signal; a signal is taken once, oldest
--          first, and the others of its name stay kept; a resent call (its reply was lost)
--          answers what the first one recorded and takes nothing more.
--!include layout.lua

local id = ARGV[1]
if redis.call('HGET', job_key(id), 'tk') ~= ARGV[2] then
  return {-1}
end
local dkey = durable_key(id)
local k = ARGV[3]
local name = ARGV[4]
-- The run asks only for a wait its record did not answer when it read it, and no other run
-- holds the lock: an answer recorded now is this call's own, sent again.
local recorded = redis.call('HGET', dkey, 'w:' .. k)
if recorded then
  if string.sub(recorded, 1, 1) == '1' then
    return {1, string.sub(recorded, 2)}
  end
  return {2}
end
local kept = redis.call('HGET', dkey, 'q:' .. name)
if kept then
  local list = cmsgpack.unpack(kept)
  local payload = table.remove(list, 1)
  if #list == 0 then
    redis.call('HDEL', dkey, 'q:' .. name)
  else
    redis.call('HSET', dkey, 'q:' .. name, cmsgpack.pack(list))
  end
  redis.call('HSET', dkey, 'w:' .. k, '1' .. payload, 'wn:' .. k, name)
  redis.call('HDEL', dkey, 'ws')
  return {1, payload}
end
local deadline = redis.call('HGET', dkey, 'wd:' .. k)
if deadline and tonumber(deadline) <= now_ms() then
  redis.call('HSET', dkey, 'w:' .. k, '0', 'wn:' .. k, name)
  redis.call('HDEL', dkey, 'ws')
  return {2}
end
return {0}
