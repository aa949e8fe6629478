-- lib/status.lua: what a finishing script (complete, fail, snooze, rate_limited) did to each
-- job, one named code per outcome. panqueue/_store/status.py's Status names the same values
-- for Python (tests/test_lua_layout.py holds the two together).
-- Needs: nothing.

local LOCK_LOST = -1      -- the token no longer matched: the job was left unchanged
local RETRY_NOW = 1       -- failed attempt; back to waiting
local RETRY_DELAYED = 2   -- failed attempt; delayed by the backoff
local FAILED = 3          -- failed for good (the dead-letter set)
local CANCELLED = 4       -- its cancellation was requested: ended cancelled
local COMPLETED = 5       -- completed
local SNOOZED = 6         -- the handler snoozed it: delayed (or waiting), no attempt used
local RATE_LIMITED = 7    -- the handler raised RateLimited: waiting, key or queue paused
local SUSPENDED = 8       -- a durable sleep or wait for a signal: delayed, no attempt used
