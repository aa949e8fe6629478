--!include _lib.lua
-- extend: renew the locks of a worker's running jobs (one call for all of them).
--
-- KEYS[1]  queue prefix
-- ARGV[1]  lock ttl ms, then pairs: job id, lock token
-- Returns  the ids whose lock is lost (token no longer matches); their deadlines are untouched.
-- Invariant: a lock is only ever extended by the holder of its current token.

local now = now_ms()
local deadline = now + tonumber(ARGV[1])
local lost = {}
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', job_key(id), 'tk') == ARGV[i + 1] then
    redis.call('ZADD', K_ACTIVE, 'XX', deadline, id)
  else
    lost[#lost + 1] = id
  end
end
return lost
