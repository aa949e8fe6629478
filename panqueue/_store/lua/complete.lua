-- complete: ACTIVE -> COMPLETED for a batch of jobs (those that finished in the same moment on
-- one worker), release jobs that depended on them, then claim the next jobs for the freed slots
-- in the same call.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  keep completed (-1 = all)   ARGV[2] lock token for claimed jobs (fresh for this
--          call: also its request id, see lib/memo.lua)   ARGV[3] lock ttl ms
-- ARGV[4]  k   ARGV[5..] k groups of 4: job id, lock token, result (msgpack), claim a next job
--          (1/0)
-- Returns  {status1, ..., statusk, count, wake_in, jobs...} (see claim). A status is COMPLETED,
--          or LOCK_LOST when the token does not match: that job's lock was lost (it stalled
--          and may run elsewhere) and it was left unchanged (lib/status.lua). One job is claimed
--          for each completed job that asked for a next one. A resent call answers as the
--          first one did and changes nothing.
-- Invariants: only the holder of a job's lock completes it (a lost lock changes nothing); only a
--          COMPLETED job releases its dependents; the claim of the next jobs is the same step
--          (claim.lua's invariants); a resent call answers from memory and changes nothing.
--!include layout.lua
--!include status.lua
--!include waiting.lua
--!include active.lua
--!include claim.lua
--!include finish.lua
--!include memo.lua

local reply = recall(ARGV[2])
if reply then
  return reply
end
local now = now_ms()
local keep = tonumber(ARGV[1])
local k = tonumber(ARGV[4])
local before = claimable()
reply = {}
local wanted = 0
local completed = {}
-- end_job's `how`, one table for the call whose per-job fields each job sets (a table made
-- per job is a tenth of the Lua work a completion does for it).
local how = {listed = completed}
for i = 0, k - 1 do
  local b = 5 + i * 4
  local id = ARGV[b]
  local jkey = job_key(id)
  -- The token check also reads what the job's history record needs (`seen`, its first three:
  -- lib/records.lua) and its batch.
  local job = redis.call('HMGET', jkey, 'a', 'et', 'st', 'tk', 'b')
  if job[4] ~= ARGV[b + 1] then
    reply[#reply + 1] = LOCK_LOST
  else
    unlock(jkey, 'e')  -- earlier attempts' errors stay in the history
    how.result, how.seen, how.token, how.batch = ARGV[b + 2], job, ARGV[b + 1], job[5]
    end_job(jkey, id, 'completed', now, keep, how)
    reply[#reply + 1] = COMPLETED
    if ARGV[b + 3] == '1' then
      wanted = wanted + 1
    end
  end
end
-- Out of the active set and into the completed set, one command each for the batch.
call_sliced(completed, 'ZREM', K_ACTIVE)
complete_listed(completed, now, keep)
claim(now, ARGV[2], tonumber(ARGV[3]), wanted, reply)
wake_if_work_appeared(before)
remember(ARGV[2], reply, k + 1, tonumber(ARGV[3]))
return reply
