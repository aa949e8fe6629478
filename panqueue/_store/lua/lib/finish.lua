-- lib/finish.lua: how a job ends. end_job is the one way into COMPLETED, FAILED or CANCELLED,
-- whichever script ends the job (complete, fail, stalled, release, cancel, add, and the cascade
-- that fails the dependents of a job that will not complete). Also retention: the finished sets
-- are trimmed to a count, and deleting a job (delete_job) is what retention and removal do.
-- Needs: layout.lua, dependencies.lua.
--
-- Finished sets: ZSETs "completed", "failed" (the dead-letter set), "cancelled"; score = the
-- finish time (ft), so the oldest go first.
--!include layout.lua
--!include dependencies.lua

local FINAL_SETS = {completed = K_COMPLETED, failed = K_FAILED, cancelled = K_CANCELLED}

-- Retention deletes jobs, deleting a job fails the jobs blocked on it, and failing a job ends
-- it: these call each other, so two of them are declared ahead of their definitions below.
local delete_job
local fail_dependents

-- Keep at most `keep` members in a finished set, deleting the oldest jobs. keep < 0 keeps
-- everything. Deleting a job can fail jobs still blocked on it (see delete_job), which adds them
-- to the failed set: trim until it is within bounds.
local function trim_finished(set, keep, now)
  if keep < 0 then
    return
  end
  local excess = redis.call('ZCARD', set) - keep
  -- A completed job has no dependency edge left: its dependencies completed before it ran,
  -- its completion released its dependents, and no edge is made to a job that completed.
  local edgeless = set == K_COMPLETED
  while excess > 0 do
    local old = redis.call('ZPOPMIN', set, excess)
    for i = 1, #old, 2 do
      delete_job(old[i], now, edgeless, true)
    end
    excess = redis.call('ZCARD', set) - keep
  end
end

-- The history stream (K_HISTORY): one entry per finished job, for exports
-- (panqueue.spark.export_history), trimmed to about meta().history entries (MAXLEN ~; 0: no
-- stream). Every entry has the same fields in the same order, so the stream stores their names
-- once per node, not per entry; a missing value is '':
--   id, state, attempts, enqueued, started, finished (ms, server clock), reason (failure
--   reason), error_type, error_message (its first 1000 bytes; from the msgpack error, so no
--   traceback is kept), worker (the worker-name part of the ending attempt's lock token).
-- how.seen: {attempts, enqueued, started} as the caller read them in a command it makes anyway
-- (complete, fail, stalled); without it, one HMGET reads them. how.token: the lock token of the
-- attempt that ended ('' worker when absent: a job that never ran, or a cascaded dependent).
-- The worker-name part of a lock token ("<name>:<random>:<counter>"), once per token: the jobs
-- of one batch mostly share the token of the claim that took them.
local WORKER_OF = {}
local function worker_of(token)
  local name = WORKER_OF[token]
  if not name then
    name = string.match(token, '^(.*):[^:]*:[^:]*$') or ''
    WORKER_OF[token] = name
  end
  return name
end

local function record_history(jkey, id, state, now, how)
  local limit = meta().history
  if limit <= 0 then
    return
  end
  local seen = how.seen or redis.call('HMGET', jkey, 'a', 'et', 'st')
  local error_type, error_message = '', ''
  if how.error then
    local ok, err = pcall(cmsgpack.unpack, how.error)
    if ok and type(err) == 'table' then
      error_type = tostring(err.type or '')
      error_message = string.sub(tostring(err.message or ''), 1, 1000)
    end
  end
  local worker = how.token and worker_of(how.token) or ''
  local reason = how.reason or (state == 'cancelled' and 'cancelled') or ''
  redis.call('XADD', K_HISTORY, 'MAXLEN', '~', limit, '*', 'id', id, 'state', state,
    'attempts', seen[1] or 0, 'enqueued', seen[2] or '', 'started', seen[3] or '',
    'finished', now, 'reason', reason, 'error_type', error_type, 'error_message', error_message,
    'worker', worker)
end

-- A job of a batch (field b) that ends, or is deleted before it ended, leaves its ending in the
-- queue's batch outbox: the batch lives in a slot of its own, which this script cannot touch,
-- so the ending is relayed to it afterwards (panqueue/_store/ops/batches.py). One member per
-- (batch, job, state): a resent script writes the same member again. `batch`: the job's b field
-- when the caller read it already (false: none), else nil and it is read here.
local function note_batch_ending(jkey, id, state, now, batch)
  if batch == nil then
    batch = redis.call('HGET', jkey, 'b')
  end
  if batch then
    redis.call('ZADD', K_BATCH_OUTBOX, now, batch .. '\t' .. id .. '\t' .. state)
  end
end

-- Job `id` ends in `state` ('completed', 'failed' or 'cancelled') at `now`. The caller has
-- taken it out of the set it was in (leave_active, detach); then, in this order:
--   1. s state, ft finish time and the fields of the ending, in one write: r result
--      (completed); e error and fr reason (failed); fr 'cancelled' (cancelled);
--   2. the event named after the state, with those fields (a cancelled event carries none);
--      how.event replaces it ({name, field, value, ...}: an add announces a job born failed);
--   3. its dependents: a completed job releases them; a failed or cancelled one fails every
--      job blocked on it, transitively (fail_dependents), recorded before any retention;
--   4. the finished set of the state;
--   5. a cancelled job's dependency edges go (forget_edges): it will never complete nor run;
--   6. retention trims that set to `keep` jobs (-1 keeps all).
-- Between 1 and 2, its record goes to the history stream (record_history), and the ending of a
-- batch job to the batch outbox (note_batch_ending).
-- `how` (optional): {result=, error=, reason=, event=, cascaded=, trim_later=, seen=, token=,
-- batch=}. cascaded: the
-- job is a dependent failed by fail_dependents, which handles its dependents and retention for
-- the whole cascade. trim_later: the caller ends several jobs and trims once after the last.
local function end_job(jkey, id, state, now, keep, how)
  how = how or {}
  local set = FINAL_SETS[state]
  local fields
  if state == 'completed' then
    fields = {'r', how.result}
  elseif state == 'failed' then
    fields = {'e', how.error, 'fr', how.reason}
  else
    fields = {'fr', how.reason or 'cancelled'}  -- 'expired': not started by its deadline
  end
  redis.call('HSET', jkey, 's', state, 'ft', now, unpack(fields))
  record_history(jkey, id, state, now, how)
  note_batch_ending(jkey, id, state, now, how.batch)
  if how.event then
    emit(how.event[1], id, unpack(how.event, 2))
  elseif state == 'cancelled' then
    if how.reason then
      emit('cancelled', id, 'fr', how.reason)
    else
      emit('cancelled', id)
    end
  else
    emit(state, id, unpack(fields))
  end
  if state == 'completed' then
    release_dependents(id, now)
  elseif not how.cascaded then
    fail_dependents(id, now, keep)
  end
  redis.call('ZADD', set, now, id)
  if state == 'cancelled' then
    forget_edges(id)
  end
  if not how.cascaded and not how.trim_later then
    trim_finished(set, keep, now)
  end
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
      {error = err, reason = 'dependency_failed', cascaded = true})
  end
  if #blocked > 0 then
    trim_finished(K_FAILED, keep, now)
  end
end

-- Delete a job: its hash, its log list and its dependency edges on both sides; the jobs still
-- blocked on it fail. (Most deleted jobs have no edge left: one EXISTS finds out, on the path
-- retention takes at every finish; `edgeless`: the caller knows there is none, see
-- trim_finished.)
delete_job = function(id, now, edgeless, finished)
  local jkey = job_key(id)
  if not finished then  -- retention (`finished`) deletes only jobs whose ending was noted
    local ending = redis.call('HMGET', jkey, 'b', 's')
    if ending[1] and not FINAL_SETS[ending[2]] then
      note_batch_ending(jkey, id, 'removed', now or now_ms())  -- it will never end: count it
    end
  end
  if not edgeless and redis.call('EXISTS', deps_key(id), needs_key(id)) > 0 then
    fail_dependents(id, now or now_ms(), -1)
    forget_edges(id)
  end
  -- A pointer in another partition names it (lib/identity.lua): a worker clears it there.
  local pointed = redis.call('HGET', jkey, 'ih')
  if pointed then
    redis.call('ZADD', K_ID_OUTBOX, now or now_ms(), id .. '\t' .. pointed)
  end
  redis.call('DEL', jkey, logs_key(id))
end
