-- lib/identity.lua: what makes an add idempotent: a custom id and a dedup key, each of which
-- names at most one live job, including on a partitioned queue where the job may live in
-- another partition than the identity's home (docs/scaling.md, "Idempotency").
-- Needs: layout.lua (id_pointer_key, fence_key), settings.lua (emit), waiting.lua (detach), finish.lua (delete_job).
--!include layout.lua
--!include settings.lua
--!include waiting.lua
--!include finish.lua
--
-- An identity's home is the partition its name routes to (panqueue/_keys.py route). When the
-- job lives there, the job itself (a custom id) or the plain dedup key (STRING "dd:<key>" ->
-- the job id) is the record, as on a queue of one partition. When the job lives elsewhere (its
-- key, its dependencies or its flow put it there), the home keeps a pointer to it:
--   STRING "idn:<job id>"  -> "<partition>\t<token>\t<since ms>"  (no expiry)
--   STRING "dd:<dedup key>" -> "<job id>\t<partition>\t<token>\t<since ms>"  (PX the dedup ttl)
-- The token names the add that wrote it. A pointer is written before its job is added, and the
-- add there carries the token: STRING "fence:<token>" in that partition refuses it. A pointer
-- whose job is missing is either an add still on its way or one that will never come (its
-- producer died, or the job was removed or trimmed since); after a grace period whoever finds it
-- fences its token there (identity_check.lua) and may then replace it. So a pointer never blocks
-- a later add for longer than the grace, and a fenced add cannot create a second job.
-- Job ids are printable, so a tab tells a pointer from a plain job id.

-- Fenced adds stay refused this long (ms): far longer than any add takes to arrive.
local FENCE_MS = 86400000

local function is_pointer(value)
  return string.find(value, '\t', 1, true) ~= nil
end

-- The dedup decision for `f` (as add_job takes it) when its key's record is here and plain:
-- the live job the add returns instead of creating one (keep, extend), or nil: the key is free
-- (no record, its job is gone, or replace took a job that had not started out of the way).
-- The job is the key's only while it carries the key (dd): a job that took the id of the
-- key's job after that one was deleted is another job, and the key is free.
local function dedup_existing(dkey, f, now)
  local existing = redis.call('GET', dkey)
  if not existing or is_pointer(existing)
      or redis.call('HGET', job_key(existing), 'dd') ~= f.dedup then
    return nil
  end
  if f.strategy == 'keep' then
    return existing
  elseif f.strategy == 'extend' then
    redis.call('PEXPIRE', dkey, f.ttl)
    return existing
  end
  -- replace: a job that has not started yet is replaced; a started one is left to run.
  local ejkey = job_key(existing)
  local state = redis.call('HGET', ejkey, 's')
  if state == 'waiting' or state == 'delayed' or state == 'blocked' then
    detach(ejkey, existing, state)
    delete_job(existing, now)  -- fails the jobs blocked on it
    emit('removed', existing, 'why', 'replaced')
  end
  return nil
end
