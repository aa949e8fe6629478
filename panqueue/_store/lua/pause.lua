-- pause: pause or resume a queue. Paused, claims return nothing (adds still queue); resumed,
-- idle workers are woken, and a pause a handler asked for (RateLimited, meta pu) ends too.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  '1' pauses, '0' resumes
-- Returns  1
-- Invariants: a pause lasts until resumed; adds are never refused while paused; a resume wakes idle
--          workers, so none sleeps past the work the pause held back.
--!include layout.lua
--!include settings.lua
--!include waiting.lua

if ARGV[1] == '1' then
  redis.call('HSET', K_META, 'paused', 1)
  emit('paused', '')
else
  redis.call('HDEL', K_META, 'paused', 'pu')  -- resume also ends a handler's RateLimited pause
  emit('resumed', '')
  wake_workers()
end
return 1
