--!include _lib.lua
-- retry: FAILED -> WAITING with a fresh set of attempts (the attempt history is kept).
--
-- KEYS[1]  queue prefix
-- ARGV[1]  limit when no ids are given, then job ids (none: the oldest `limit` failed jobs)
-- Returns  how many jobs were moved back
local ids = {}
if #ARGV > 1 then
  for i = 2, #ARGV do
    ids[#ids + 1] = ARGV[i]
  end
else
  ids = redis.call('ZRANGE', K_FAILED, 0, tonumber(ARGV[1]) - 1)
end
local before = claimable()
local moved = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', K_FAILED, id) == 1 then
    local jkey = job_key(id)
    redis.call('HSET', jkey, 'a', 0, 'sc', 0)
    redis.call('HDEL', jkey, 'e', 'fr', 'ft', 'r', 'dp')
    enqueue_waiting(jkey, id)
    emit('waiting', id, 'why', 'retried')
    moved = moved + 1
  end
end
wake_if_work_appeared(before)
return moved
