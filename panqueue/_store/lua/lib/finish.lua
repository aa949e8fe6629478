-- lib/finish.lua: how a job ends. end_job is the one way into COMPLETED, FAILED or CANCELLED,
-- whichever script ends the job (complete, the endings of an attempt (lib/ending.lua), stalled,
-- release, cancel, add, and the cascade that fails the dependents of a job that will not
-- complete). Retention, and deleting a job, are lib/retention.lua's (included here).
-- Needs: layout.lua, settings.lua (emit), dependencies.lua, records.lua, retention.lua.
--!include layout.lua
--!include settings.lua
--!include dependencies.lua
--!include records.lua
--!include retention.lua

-- Job `id` ends in `state` ('completed', 'failed' or 'cancelled') at `now`. The caller has
-- taken it out of the set it was in (leave_active, detach); then, in this order:
--   1. s state, ft finish time and the fields of the ending, in one write: r result
--      (completed); e error and fr reason (failed); fr 'cancelled' (cancelled);
--   2. the event named after the state, with those fields (a cancelled event carries none),
--      while somebody waits on results or reads events, or when `keep` is 0 (lib/settings.lua
--      emit_event); how.event replaces it ({name, field, value, ...}: an add announces a job
--      born failed);
--   3. its dependents: a completed job releases them; a failed or cancelled one fails every
--      job blocked on it, transitively (fail_dependents), recorded before any retention;
--   4. the finished set of the state;
--   5. a cancelled job's dependency edges go (forget_edges): it will never complete nor run;
--   6. retention trims that set to `keep` jobs (-1 keeps all).
-- Between 1 and 2, its record goes to the history stream (record_history), and the ending of a
-- batch job to the batch outbox (note_batch_ending): lib/records.lua.
-- `how` (optional): {result=, error=, reason=, event=, cascaded=, always=, listed=, seen=,
-- token=, batch=}. cascaded: the job is a dependent failed by fail_dependents, which handles
-- its dependents and retention for the whole cascade (always: that retention keeps none).
-- listed (completed only): the caller completes several jobs; the id is appended to this
-- list, and steps 3, 4 and 6 are complete_listed's, once for all of them. seen, token: see
-- record_history; batch: see note_batch_ending.
local function end_job(jkey, id, state, now, keep, how)
  how = how or {}
  local set = FINAL_SETS[state]
  -- The fields of the ending: one or two (no table: this runs for every job that ends).
  local f1, v1, f2, v2
  if state == 'completed' then
    f1, v1 = 'r', how.result
  elseif state == 'failed' then
    f1, v1, f2, v2 = 'e', how.error, 'fr', how.reason
  else
    f1, v1 = 'fr', how.reason or 'cancelled'  -- 'expired': not started by its deadline
  end
  if f2 then
    redis.call('HSET', jkey, 's', state, 'ft', int_arg(now), f1, v1, f2, v2)
  else
    redis.call('HSET', jkey, 's', state, 'ft', int_arg(now), f1, v1)
  end
  record_history(jkey, id, state, now, how)
  note_batch_ending(jkey, id, state, now, how.batch)
  -- Its outcome is left nowhere else when its set keeps none (lib/settings.lua emit_event); a
  -- cascaded dependent's set is trimmed to the keep of the cascade (how.always).
  local always = keep == 0 or how.always
  if how.event then
    emit_event(always, how.event[1], id, unpack(how.event, 2))
  elseif state == 'cancelled' then
    if how.reason then
      emit_event(always, 'cancelled', id, 'fr', how.reason)
    else
      emit_event(always, 'cancelled', id)
    end
  elseif f2 then
    emit_event(always, state, id, f1, v1, f2, v2)
  else
    emit_event(always, state, id, f1, v1)
  end
  if how.listed then
    how.listed[#how.listed + 1] = id
    return
  end
  if state == 'completed' then
    release_dependents(id, now)
  elseif not how.cascaded then
    fail_dependents(id, now, keep)
  end
  redis.call('ZADD', set, int_arg(now), id)
  if state == 'cancelled' then
    forget_edges(id)
  end
  if not how.cascaded then
    trim_finished(set, keep, now)
  end
end

-- The jobs `ids`, completed together at `now` by end_job (how.listed), enter the completed set
-- in one command; their dependents are released (one EXISTS finds whether any job has some:
-- mostly none does); then retention trims the set once.
local function complete_listed(ids, now, keep)
  if #ids == 0 then
    return
  end
  local members, edges = {}, {}
  for i, id in ipairs(ids) do
    members[2 * i - 1] = int_arg(now)
    members[2 * i] = id
    edges[i] = deps_key(id)
  end
  call_sliced(members, 'ZADD', K_COMPLETED)
  if call_sliced(edges, 'EXISTS') > 0 then
    for _, id in ipairs(ids) do
      release_dependents(id, now)
    end
  end
  trim_finished(K_COMPLETED, keep, now)
end

-- Job `id` will not complete now (failed, cancelled, deleted): every job blocked on it fails,
-- transitively, with reason "dependency_failed". The edges stay (lib/dependencies.lua).
-- Retention is applied once the whole cascade is recorded: trimming in the middle of it would
-- delete a dependent before its own dependents were failed.
fail_dependents = function(id, now, keep)
  local blocked = blocked_dependents(id)
  for _, dependent in ipairs(blocked) do
    redis.call('ZREM', K_BLOCKED, dependent.id)
    local err = cmsgpack.pack({type = 'DependencyFailed',
      message = 'dependency ' .. dependent.via .. ' did not complete'})
    end_job(job_key(dependent.id), dependent.id, 'failed', now, -1,
      {error = err, reason = 'dependency_failed', cascaded = true, always = keep == 0})
  end
  if #blocked > 0 then
    trim_finished(K_FAILED, keep, now)
  end
end
