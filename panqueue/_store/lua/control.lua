-- control: a command for one live worker of the queue (client.control): stop, pause, resume,
-- or a new concurrency. Its next heartbeat takes it (heartbeat.lua) and the worker applies it.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  worker name   ARGV[2] the command ('stop', 'pause', 'resume' or 'concurrency:<n>')
-- Returns  1 when the worker has a live entry here and the command was queued for it, else 0
-- Invariants: a command is queued only for a worker with a live entry, and lives no longer than
--          that entry (its expiry is the entry's): a worker that is gone, or one started later
--          under the same name, never receives it. Commands are taken in the order they were
--          given, each once.
--!include layout.lua

local name = ARGV[1]
local expires = redis.call('ZSCORE', K_WORKERS, name)
if not expires or tonumber(expires) <= now_ms() then
  return 0
end
local key = control_key(name)
redis.call('RPUSH', key, ARGV[2])
redis.call('PEXPIREAT', key, math.floor(tonumber(expires)))
return 1
