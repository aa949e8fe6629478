--!include _lib.lua
-- release: a worker gives jobs back (forced shutdown): ACTIVE -> WAITING at their old position,
-- at once rather than after the lock expires. The interrupted attempt does not count.
--
-- KEYS[1]  queue prefix
-- ARGV     pairs: job id, lock token
-- Returns  how many jobs were released (a job whose token no longer matches is left alone).

local released = 0
local was_empty = redis.call('ZCARD', K_WAIT) == 0
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  local jkey = job_key(id)
  if redis.call('HGET', jkey, 'tk') == ARGV[i + 1] then
    redis.call('ZREM', K_ACTIVE, id)
    redis.call('HDEL', jkey, 'tk')
    redis.call('HINCRBY', jkey, 'a', -1)
    requeue_waiting(jkey, id)
    emit('waiting', id, 'why', 'released')
    released = released + 1
  end
end
if released > 0 and was_empty then
  wake_workers()
end
return released
