-- promote: move due DELAYED jobs to WAITING (workers also do this on every claim).
--
-- KEYS[1]  queue prefix
-- ARGV     none
-- Returns  {promoted, wake_in}
-- Invariants: a job moves DELAYED -> WAITING only once due by the server's clock, at most
--          PROMOTE_BATCH per call (lib/delayed.lua); idle workers are woken when this made work
--          claimable.
--!include layout.lua
--!include waiting.lua
--!include delayed.lua

local now = now_ms()
local before = claimable()
local moved = promote_due(now)
wake_if_work_appeared(before)
return {moved, wake_in(now)}
