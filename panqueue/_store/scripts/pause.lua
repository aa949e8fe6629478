--!include _lib.lua
-- pause / resume: ARGV[1] '1' pauses (claims return nothing; adds still queue), '0' resumes and
-- wakes idle workers.
--
-- KEYS[1]  queue prefix
-- Returns  1
if ARGV[1] == '1' then
  redis.call('HSET', K_META, 'paused', 1)
  emit('paused', '')
else
  redis.call('HDEL', K_META, 'paused')
  emit('resumed', '')
  wake_workers()
end
return 1
