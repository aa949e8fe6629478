-- identity_check: look, in the partition a pointer names, at the job it points to
-- (lib/identity.lua): is it there, still on its way, or never coming?
--
-- KEYS[1]  queue prefix (the partition the pointer names)
-- ARGV[1]  job id   ARGV[2] the pointer's token   ARGV[3] the pointer's since (ms)
-- ARGV[4]  the grace (ms): a pointer younger than this whose job is missing is an add on its way
-- ARGV[5]  '1': the pointer is a dedup key's and the add replaces: a job that has not started
--          yet is deleted (dependents fail; 'removed' with why 'replaced'), as add does
-- ARGV[6]  a dedup key's pointer: the key ('' for a custom id's). When the pointer's token
--          says its job carries the key (a leading 'k', panqueue/_store/ops/identity.py
--          HELD_TOKEN_MARK), a job under the id that does not is another job, which took the
--          id after the pointer's was deleted: the pointer's job counts as missing
-- Returns  {'job', state}: the job exists; {'wait', ms}: missing, the add may still come;
--          {'gone'}: missing (or replaced now) and its token fenced here, so no add of it can
--          come any more: the pointer may be cleared (identity_reserve.lua 'clear').
-- Invariants: a token is fenced only while its job is missing, so a fenced add never leaves a
--          second job and a pointer is never dropped while its job lives.
--!include layout.lua
--!include settings.lua
--!include waiting.lua
--!include finish.lua
--!include identity.lua

local id, token = ARGV[1], ARGV[2]
local now = now_ms()
local jkey = job_key(id)
local held = redis.call('HMGET', jkey, 's', 'dd')
local state = held[1]
if state and (ARGV[6] or '') ~= '' and string.sub(token, 1, 1) == 'k' and held[2] ~= ARGV[6] then
  state = nil
end
if state then
  if ARGV[5] == '1' and (state == 'waiting' or state == 'delayed' or state == 'blocked') then
    detach(jkey, id, state)
    delete_job(id, now)  -- fails the jobs blocked on it
    emit('removed', id, 'why', 'replaced')
  else
    return {'job', state}
  end
else
  local wait = tonumber(ARGV[3]) + tonumber(ARGV[4]) - now
  if wait > 0 and redis.call('EXISTS', fence_key(token)) == 0 then
    return {'wait', wait}
  end
end
redis.call('SET', fence_key(token), '1', 'PX', FENCE_MS)
return {'gone'}
