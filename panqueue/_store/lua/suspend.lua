-- suspend: a durable job's handler sleeps (job.sleep) or waits for a signal (job.wait_for)
-- that is not there yet: ACTIVE -> DELAYED until the sleep's wake time, or until the signal
-- comes (signal.lua wakes it) or the wait's deadline passes, without using an attempt (the
-- count the claim raised goes back down). The lock is released and the slot is free; the job
-- runs again from the top, its steps replayed from their stored results. A sleep's wake time
-- and a wait's deadline are stored on the first call, by the wait's order in the run (k), so
-- that a run after them finds them passed. A job whose cancellation was requested ends
-- CANCELLED. Its deadline to start by (add's expires=) applies again while it waits, as after a
-- snooze. Then claim the next jobs for the slot. The steps are those of every ending of
-- an attempt (lib/ending.lua).
--
-- KEYS[1]  queue prefix
-- ARGV[1]  job id   ARGV[2] lock token   ARGV[3] history entry (msgpack)
-- ARGV[4]  keep failed (-1 = all)   ARGV[5] claim n   ARGV[6] new lock token (fresh for this
--          call: also its request id, see lib/memo.lua)   ARGV[7] lock ttl ms
-- ARGV[8]  'sleep' or 'signal'   ARGV[9] the sleep's or the wait's order in the run (k)
-- ARGV[10] a sleep's wake time (ms since the epoch; 0: ARGV[11] from now)
-- ARGV[11] a sleep: ms from now; a wait: its timeout in ms (-1: none)
-- ARGV[12] the signal's name ('' for a sleep)
-- Returns  {status, count, wake_in, jobs...}; status (lib/status.lua) SUSPENDED or CANCELLED;
--          or {LOCK_LOST} when the token does not match (nothing changed). A resent call
--          answers as the first one did and changes nothing.
-- Invariants: only the holder of the lock suspends a job; a suspension never changes how many
--          attempts the job has left; a signal kept before this call wakes the job at once
--          (none is lost between signal_take.lua and this call).
--!include ending.lua

-- The score of a job that waits for a signal with no timeout: far beyond any real time.
local FOREVER_MS = 1125899906842624

local early, at = open_ending({id = ARGV[1], token = ARGV[2], request = ARGV[6],
  keep = tonumber(ARGV[4]), claim_n = tonumber(ARGV[5]), ttl = tonumber(ARGV[7])})
if early then
  return early
end
leave_with_entry(at, ARGV[3])
if cancel_heard(at) then
  return ending_reply(at, CANCELLED)
end
local attempts = give_back(at)
local dkey = durable_key(at.id)
local k = ARGV[9]
local wake
if ARGV[8] == 'sleep' then
  wake = tonumber(redis.call('HGET', dkey, 'z:' .. k))
  if not wake then
    wake = tonumber(ARGV[10])
    if wake == 0 then
      wake = at.now + tonumber(ARGV[11])
    end
    redis.call('HSET', dkey, 'z:' .. k, wake)
  end
  if wake <= at.now then
    redis.call('HSET', dkey, 'zp:' .. k, 1)
  end
else
  local name = ARGV[12]
  if redis.call('HEXISTS', dkey, 'q:' .. name) == 1 then
    wake = at.now  -- it came after the worker looked: run again now and take it
  else
    wake = tonumber(redis.call('HGET', dkey, 'wd:' .. k))
    if not wake and tonumber(ARGV[11]) >= 0 then
      wake = at.now + tonumber(ARGV[11])
      redis.call('HSET', dkey, 'wd:' .. k, wake)
    end
    wake = wake or FOREVER_MS
  end
end
run_again(at, 'suspended', attempts, redis.call('HGET', at.jkey, 'x'),
  math.max(0, wake - at.now))
if ARGV[8] ~= 'sleep' and wake > at.now then
  -- The mark signal.lua wakes it by, for this DELAYED stint only (run_again cleared any older
  -- one): every later ending that runs the job again clears it.
  redis.call('HSET', dkey, 'ws', ARGV[12])
end
return ending_reply(at, SUSPENDED)
