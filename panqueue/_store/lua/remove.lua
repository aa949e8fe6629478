-- remove: delete a job that is not active, with its dependency edges (jobs blocked on it fail;
-- its failed dependents can no longer be retried).
--
-- KEYS[1]  queue prefix
-- ARGV[1]  job id   ARGV[2] the state it must be in ('': any state but active)
-- Returns  1 removed, 0 no such job, or not in ARGV[2]'s state (a bulk remove_jobs picked it
--          in that state and it moved on since: left as it is), -1 the job is active (cancel it
--          first; nothing changed)
-- Invariants: an ACTIVE job is never removed (its worker holds it: cancel it first); a removed job
--          is in no state set, and its dependency edges go on both sides (delete_job), its blocked
--          dependents failing, so no job waits for one that is gone.
--!include layout.lua
--!include settings.lua
--!include waiting.lua
--!include finish.lua

local id = ARGV[1]
local jkey = job_key(id)
local state = redis.call('HGET', jkey, 's')
if not state then
  return 0
end
if state == 'active' then
  return -1
end
local wanted = ARGV[2]
if wanted and wanted ~= '' and state ~= wanted then
  return 0
end
detach(jkey, id, state)
for _, set in ipairs({K_COMPLETED, K_FAILED, K_CANCELLED}) do
  redis.call('ZREM', set, id)
end
delete_job(id, now_ms())  -- fails the jobs blocked on it
emit('removed', id)
return 1
