-- lib/retention.lua: how many finished jobs a queue keeps. The finished sets are trimmed to a
-- count (trim_finished), and deleting a job (delete_job) is what retention and removal do.
-- Included by lib/finish.lua, which defines fail_dependents (declared here): deleting a job
-- fails the jobs blocked on it, failing a job ends it, and an ending trims a finished set, so
-- the two files call each other. Include finish.lua, not this file.
-- Needs: layout.lua, settings.lua, dependencies.lua, flow_record.lua, records.lua.
--
-- Finished sets: ZSETs "completed", "failed" (the dead-letter set), "cancelled"; score = the
-- finish time (ft), so the oldest go first.
--!include layout.lua
--!include settings.lua
--!include dependencies.lua
--!include flow_record.lua
--!include records.lua

local FINAL_SETS = {completed = K_COMPLETED, failed = K_FAILED, cancelled = K_CANCELLED}

local fail_dependents  -- lib/finish.lua
local delete_job  -- below: trim_finished deletes jobs

-- Keep at most `keep` members in a finished set, deleting the oldest jobs. keep < 0 keeps
-- everything. Deleting a job can fail jobs still blocked on it (see delete_job), which adds them
-- to the failed set: trim until it is within bounds. The oldest are read without their scores
-- and removed by rank: a reply with scores formats each one as a double (ZPOPMIN), about ten
-- times the cost of the members alone.
local function trim_finished(set, keep, now)
  if keep < 0 then
    return
  end
  local excess = redis.call('ZCARD', set) - keep
  -- A completed job has no dependency edge left: its dependencies completed before it ran,
  -- its completion released its dependents, and no edge is made to a job that completed. So
  -- deleting one adds nothing to any finished set, and one pass is enough, whose jobs' keys
  -- go in one DEL (`keys`).
  local edgeless = set == K_COMPLETED
  while excess > 0 do
    local old = redis.call('ZRANGE', set, 0, excess - 1)
    redis.call('ZREMRANGEBYRANK', set, 0, excess - 1)
    local keys = edgeless and {} or nil
    for _, id in ipairs(old) do
      delete_job(id, now, edgeless, true, keys)
    end
    if edgeless then
      call_sliced(keys, 'DEL')
      return
    end
    excess = redis.call('ZCARD', set) - keep
  end
end

-- Delete a job: its hash, its log list, its entries in its tags' indexes, its durable record,
-- its dependency edges on both sides and its flow's record (forget_flow); the jobs still
-- blocked on it fail. (Most deleted jobs have no edge left: one EXISTS finds out, on the path
-- retention takes at every finish; `edgeless`: the caller knows there is none, see
-- trim_finished. `finished`: retention deletes it, a job whose ending was noted. `keys`: a
-- list the job's keys are appended to, for the caller to delete.)
delete_job = function(id, now, edgeless, finished, keys)
  local jkey = job_key(id)
  if not finished then  -- retention (`finished`) deletes only jobs whose ending was noted
    local ending = redis.call('HMGET', jkey, 'b', 's')
    if ending[1] and not FINAL_SETS[ending[2]] then
      note_batch_ending(jkey, id, 'removed', now or now_ms())  -- it will never end: count it
    end
  end
  if not edgeless and redis.call('EXISTS', deps_key(id), needs_key(id)) > 0 then
    -- Their ending trims the failed set as the queue's workers declared (kf), as any finish
    -- by a client does; retention's own deletions leave that to the trim under way.
    fail_dependents(id, now or now_ms(), finished and -1 or cancelled_keep())
    forget_edges(id)
  end
  -- A pointer in another partition names it (lib/identity.lua): a worker clears it there.
  -- Its id's pointer, its tags and what it was added depending on, in one read.
  local held = redis.call('HMGET', jkey, 'ih', 'tg', 'dp')
  local pointed, tags = held[1], held[2]
  if pointed then
    redis.call('ZADD', K_ID_OUTBOX, now or now_ms(), id .. '\t' .. pointed)
  end
  if tags then  -- a tag's index holds only stored jobs
    for tag in string.gmatch(tags, '[^\n]+') do
      redis.call('ZREM', tag_key(tag), id)
    end
  end
  forget_flow(id, held[3])
  if keys then
    local n = #keys
    keys[n + 1], keys[n + 2], keys[n + 3], keys[n + 4] = jkey, logs_key(id), durable_key(id),
      flow_key(id)
  else
    redis.call('DEL', jkey, logs_key(id), durable_key(id), flow_key(id))
  end
end
