-- claim: take up to n jobs WAITING -> ACTIVE for one worker (its free slots), locking each.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  lock token (fresh for this call: also its request id, see lib/memo.lua)
-- ARGV[2]  lock ttl ms   ARGV[3] n (free slots)
-- ARGV[4]  (optional) idle wait ms: when nothing is claimed, register this call's token as
--          idle for that long, so that the next add hands a job straight to the worker (0 or
--          absent: do not)
-- ARGV[5]  (optional) start-by: the deadline (ms) of the rate-limit starts this claim uses (a
--          partitioned queue's shared window, lua/rate_take.lua); a claim that runs later
--          claims nothing and answers wake_in 0 (0 or absent: no deadline)
-- ARGV[6...] tokens of this worker's idle registrations to withdraw: the call ends them and
--          takes over the jobs handed to them meanwhile (lib/handoff.lua; a cancel requested
--          for one of those is told again for its new lock, lib/cancel_request.lua)
-- Returns  {count, wake_in, id, data, attempt, enqueued_at, options, ...}
--          attempt: a number, or a string when the job never ran before (lib/activate.lua).
--          wake_in: when count is 0, ms until the next delayed job is due (-1: none; 0: the
--          starts came too late, take new ones now).
-- Invariants: nothing is claimed while the queue is paused, nor with rate-limit starts past their
--          deadline (a job starts no later than the window counts it); due delayed jobs are
--          promoted first;
--          claim and lock are one step; a resent call claims nothing more (it answers the
--          jobs the first call claimed that its token still holds).
--!include layout.lua
--!include settings.lua
--!include claim.lua
--!include memo.lua
--!include handoff.lua

local reply = recall(ARGV[1])
if reply then
  return reply
end
local now = now_ms()
local start_by = tonumber(ARGV[5] or '0')
if start_by > 0 and now > start_by then
  return {0, 0}
end
local ttl = tonumber(ARGV[2])
local taken = {}
for i = 6, #ARGV do
  withdraw_idle(ARGV[i], ARGV[1], ttl, taken)
end
reply = {}
claim(now, ARGV[1], ttl, tonumber(ARGV[3]) - #taken / 5, reply)
for _, field in ipairs(taken) do
  reply[#reply + 1] = field
end
reply[1] = reply[1] + #taken / 5
local idle_ms = tonumber(ARGV[4] or '0')
if reply[1] == 0 and idle_ms > 0 and not meta().paused then
  register_idle(ARGV[1], ttl, now, idle_ms)
end
remember(ARGV[1], reply, 1, ttl)
return reply
