--!include _lib.lua
-- complete: ACTIVE -> COMPLETED, release jobs that depended on it, then claim the next jobs
-- for the freed slot in the same call.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  job id   ARGV[2] lock token   ARGV[3] result (msgpack)
-- ARGV[4]  keep completed (-1 = all)   ARGV[5] claim n (0 = none)   ARGV[6] new lock token
-- ARGV[7]  lock ttl ms
-- Returns  {1, count, wake_in, jobs...} (see claim), or {-1} when the token does not match:
--          the lock was lost (the job stalled and may run elsewhere) and nothing changed.

local id = ARGV[1]
local jkey = job_key(id)
if redis.call('HGET', jkey, 'tk') ~= ARGV[2] then
  return {-1}
end
local now = now_ms()
local before = claimable()
leave_active(jkey, id)
redis.call('HSET', jkey, 'r', ARGV[3])
redis.call('HDEL', jkey, 'e')  -- earlier attempts' errors stay in the history
emit('completed', id, 'r', ARGV[3])
release_dependents(id, now)
finish(jkey, id, K_COMPLETED, 'completed', now, tonumber(ARGV[4]))
local reply = {1}
claim(now, ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[5]), reply)
wake_if_work_appeared(before)
return reply
