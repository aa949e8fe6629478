--!include _lib.lua
-- promote: move due DELAYED jobs to WAITING (workers also do this on every claim).
--
-- KEYS[1]  queue prefix
-- Returns  {promoted, wake_in}
local now = now_ms()
local was_empty = redis.call('ZCARD', K_WAIT) == 0
local moved = promote_due(now)
if moved > 0 and was_empty then
  wake_workers()
end
return {moved, wake_in(now)}
