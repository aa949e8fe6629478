-- progress: a running job reports progress or appends a log line. Only the lock holder may.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  job id   ARGV[2] lock token   ARGV[3] 'p' (progress) or 'l' (log)
-- ARGV[4]  value (msgpack progress, or the log line)   ARGV[5] max log lines kept
-- Returns  1, or 0 when the lock is lost (nothing written)
-- Invariants: only the holder of the job's lock writes (a stalled run whose job moved on writes
--          nothing); the log keeps the newest ARGV[5] lines at most.
--!include layout.lua
--!include settings.lua

local id = ARGV[1]
local jkey = job_key(id)
if redis.call('HGET', jkey, 'tk') ~= ARGV[2] then
  return 0
end
if ARGV[3] == 'p' then
  redis.call('HSET', jkey, 'pg', ARGV[4])
  emit('progress', id, 'pg', ARGV[4])
else
  local lkey = logs_key(id)
  redis.call('RPUSH', lkey, ARGV[4])
  redis.call('LTRIM', lkey, -tonumber(ARGV[5]), -1)
end
return 1
