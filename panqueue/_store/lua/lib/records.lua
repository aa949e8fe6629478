-- lib/records.lua: what the ending of a job leaves for readers outside the script that ends
-- it: its entry in the history stream (record_history), and for a job of a batch its line in
-- the batch outbox (note_batch_ending). end_job (lib/finish.lua) writes both for every ending,
-- whichever script ends the job; deleting an unfinished job of a batch notes it too.
-- Needs: layout.lua.
--
-- The history stream (K_HISTORY): one entry per finished job, for exports
-- (panqueue.spark.export_history, panqueue/_store/ops/history.py), trimmed to about
-- meta().history entries (MAXLEN ~; 0: no stream). Every entry has the same fields in the same
-- order, so the stream stores their names once per node, not per entry; a missing value is '':
--   id, state, attempts, enqueued, started, finished (ms, server clock), reason (failure
--   reason), error_type, error_message (its first 1000 bytes; from the msgpack error, so no
--   traceback is kept), worker (the worker-name part of the ending attempt's lock token).
--!include layout.lua

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

-- Job `id` ended in `state` at `now`; `how` is end_job's. how.seen: {attempts, enqueued,
-- started, ...} (its first three) as the caller read them in a command it makes anyway
-- (complete, fail, stalled);
-- without it, one HMGET reads them. how.token: the lock token of the attempt that ended (''
-- worker when absent: a job that never ran, or a cascaded dependent).
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
  append_capped(K_HISTORY, limit, 'id', id, 'state', state,
    'attempts', seen[1] or '0', 'enqueued', seen[2] or '', 'started', seen[3] or '',
    'finished', int_arg(now), 'reason', reason, 'error_type', error_type,
    'error_message', error_message, 'worker', worker)
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
    redis.call('ZADD', K_BATCH_OUTBOX, int_arg(now), batch .. '\t' .. id .. '\t' .. state)
  end
end
