-- snooze: the handler asked to run the job again later (Snooze): ACTIVE -> DELAYED for the
-- requested time (WAITING at the back of its priority when that is 0), without using an
-- attempt: the attempt count the claim raised goes back down, and the snooze is counted (sn)
-- and recorded in the history instead. A job that snoozes more than max snoozes times ends
-- FAILED (max_snoozes_exceeded, this run counted as its attempt); a job whose cancellation was
-- requested ends CANCELLED. Then claim the next jobs for the slot. The steps are those of
-- every ending of an attempt (lib/ending.lua).
--
-- KEYS[1]  queue prefix
-- ARGV[1]  job id   ARGV[2] lock token   ARGV[3] delay ms (0 .. 2^52)
-- ARGV[4]  history entry (msgpack)   ARGV[5] max snoozes (-1 = no limit)
-- ARGV[6]  keep failed (-1 = all)   ARGV[7] claim n   ARGV[8] new lock token (fresh for this
--          call: also its request id, see lib/memo.lua)   ARGV[9] lock ttl ms
-- Returns  {status, count, wake_in, jobs...}; status (lib/status.lua) SNOOZED, FAILED or
--          CANCELLED; or {LOCK_LOST} when the token does not match (nothing changed). A resent
--          call answers as the first one did and changes nothing.
-- Invariants: only the holder of the lock snoozes a job; a snooze never changes how many
--          attempts the job has left.
--!include ending.lua

local early, at = open_ending({id = ARGV[1], token = ARGV[2], request = ARGV[8],
  keep = tonumber(ARGV[6]), claim_n = tonumber(ARGV[7]), ttl = tonumber(ARGV[9])})
if early then
  return early
end
local max_snoozes = tonumber(ARGV[5])
leave_with_entry(at, ARGV[4])
local snoozes = redis.call('HINCRBY', at.jkey, 'sn', 1)

local status
if cancel_heard(at) then
  status = CANCELLED
elseif max_snoozes >= 0 and snoozes > max_snoozes then
  status = FAILED
  end_failed(at, cmsgpack.pack({type = 'MaxSnoozesExceeded', message = 'snoozed ' .. snoozes
    .. ' times; the handler allows at most ' .. max_snoozes .. ' (max_snoozes)'}),
    'max_snoozes_exceeded')
else
  status = SNOOZED
  local attempts = give_back(at)
  run_again(at, 'snoozed', attempts, redis.call('HGET', at.jkey, 'x'), tonumber(ARGV[3]))
end
return ending_reply(at, status)
