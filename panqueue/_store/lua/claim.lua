-- claim: take up to n jobs WAITING -> ACTIVE for one worker (its free slots), locking each.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  lock token (fresh for this call: also its request id, see lib/memo.lua)
-- ARGV[2]  lock ttl ms   ARGV[3] n (free slots)
-- Returns  {count, wake_in, id, data, attempt, enqueued_at, options, ...}
--          wake_in: when count is 0, ms until the next delayed job is due (-1: none).
-- Invariants: nothing is claimed while the queue is paused; due delayed jobs are promoted first;
--          claim and lock are one step; a resent call claims nothing more (it answers the
--          jobs the first call claimed that its token still holds).
--!include layout.lua
--!include claim.lua
--!include memo.lua

local reply = recall(ARGV[1])
if reply then
  return reply
end
reply = {}
claim(now_ms(), ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), reply)
remember(ARGV[1], reply, 1, tonumber(ARGV[2]))
return reply
