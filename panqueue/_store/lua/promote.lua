-- promote: move due DELAYED jobs to WAITING (workers also do this on every claim).
--
-- KEYS[1]  queue prefix
-- Returns  {promoted, wake_in}
--!include layout.lua
--!include waiting.lua

local now = now_ms()
local before = claimable()
local moved = promote_due(now)
wake_if_work_appeared(before)
return {moved, wake_in(now)}
