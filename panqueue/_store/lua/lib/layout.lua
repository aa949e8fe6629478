-- lib/layout.lua: the key layout of one queue, the job hash's fields, the server clock, events
-- and the queue's settings (meta). Every script starts from here.
-- Needs: nothing.
--
-- KEYS[1] is always the queue prefix "{q:<queue>}:"; every other key of the queue is derived
-- from it, so one script only ever touches one hash slot. panqueue/_keys.py names the same keys
-- for Python (tests/test_lua_layout.py holds the two together).
--
-- Job hash fields (job_key(id)):
--   d  data (msgpack)          s  state              p  priority (absent: 0)  ws wait-set score (set at claim)
--   et enqueued at (ms)        st started at (ms)    ft finished at     a  attempts started
--   tk lock token (while active)                     o  job options (msgpack, optional)
--   r  result (msgpack)        e  error (msgpack)    h  attempt history (concatenated msgpack)
--   fr failure reason          sc times stalled      cx cancel requested
--   sn times snoozed (snooze.lua: Snooze from the handler; not attempts)
--   x  deadline to start by (ms; add's expires=, lib/expiry.lua)
--   pg progress (msgpack)      k  concurrency key (keyed mode)
--   dd dedup key               ra run-at of a blocked job that was added with a delay
--   dx a dependency that was cancelled or deleted before it completed: the job can never run
--   b  the batch the job belongs to (batch_*.lua; its ending goes to "batch_outbox")
--   ih partitioned queues: "<home partition>\t<token>" of the pointer in its custom id's home
--      partition (lib/identity.lua); deleting the job queues its removal ("id_outbox")
-- Per job: "job:<id>:logs" (LIST, capped); its dependency edges (lib/dependencies.lua).
--
-- Queue meta (HASH "meta"): v schema version, mode (global|keyed), kc key concurrency,
-- kf failed/cancelled jobs kept (for producers' cancels), seq (wait order), id (generated ids),
-- paused, kw (waiting jobs in keyed lists), rlm / rlp / rlk (rate limit: max, per ms, per key),
-- rls (rate-limit entry counter), kh (history records kept: Retention.history; 0 = none),
-- pu (global mode: no job starts before this time, ms: a handler raised RateLimited,
-- rate_limited.lua), np / pi / lv (partitioned queues: the partition count, this partition's
-- index and the version of the layout they belong to; absent: 1, 0 and 0; np 0: a partition
-- that a layout change left out; a generated id is id counter * np + pi, so id % np names the
-- partition, panqueue/_keys.py route), pl (the home's: how the partitions are named,
-- panqueue/_keys.py partition_tags; absent: the "#i" suffixes of queues declared before it).
-- History (STREAM "history"): one entry per finished job, appended by end_job (lib/finish.lua);
-- read by exports (panqueue.spark.export_history) through their consumer group.
-- Worker registry: ZSET "workers" (worker name -> when its entry expires, ms) and HASH
-- "worker_info" (worker name -> its record, msgpack); heartbeat.lua writes both, workers.lua
-- reads them and prunes the expired.
-- Idle workers (ZSET "idle", lib/handoff.lua): "<lock ttl ms>:<claim token>" -> when the
-- registration expires (ms); an add hands a job straight to one of them.
-- Batches: ZSET "batch_outbox" ("<batch>\t<job>\t<state>" -> when the job ended; lib/finish.lua
-- writes it, panqueue/_store/ops/batches.py relays it to the batch's own slot) and ZSET
-- "batches" (the batches whose callbacks go to this queue -> when to look at them again).
-- Identities (lib/identity.lua): ZSET "id_outbox" ("<job id>\t<home partition>\t<token>" ->
-- when the job was deleted): the pointers in other partitions that name deleted jobs, which
-- workers clear there (panqueue/_store/ops/identity.py forget_deleted).
-- All times come from the server clock (TIME), never from a worker host.

local P = KEYS[1]
local K_META = P .. 'meta'
local K_WAIT = P .. 'wait'
local K_DELAYED = P .. 'delayed'
local K_BLOCKED = P .. 'blocked'
local K_ACTIVE = P .. 'active'
local K_COMPLETED = P .. 'completed'
local K_FAILED = P .. 'failed'
local K_CANCELLED = P .. 'cancelled'
local K_EVENTS = P .. 'events'
local K_NOTIFY = P .. 'notify'
local K_SCHEDULES = P .. 'schedules'
local K_READY = P .. 'k:ready'
local K_KEY_ACTIVE = P .. 'k:active'
local K_LIMITED = P .. 'k:limited'
local K_RATE = P .. 'rl'
local K_WORKERS = P .. 'workers'
local K_WORKER_INFO = P .. 'worker_info'
local K_IDLE = P .. 'idle'
local K_EXPIRES = P .. 'expires'
local K_HISTORY = P .. 'history'
local K_BATCH_OUTBOX = P .. 'batch_outbox'
local K_BATCHES = P .. 'batches'
local K_ID_OUTBOX = P .. 'id_outbox'
-- The home's lock of a layout change (STRING: the changer's token; relayout.lua).
local K_RELAYOUT = P .. 'relayout'
local EVENTS_MAXLEN = 10000
local HISTORY_MAXLEN = 100000  -- Retention.history's default, for a queue no worker has set up

local function job_key(id)
  return P .. 'job:' .. id
end

local function logs_key(id)
  return P .. 'job:' .. id .. ':logs'
end

-- Keyed mode: the waiting jobs of one key (lib/waiting.lua).
local function key_list(key)
  return P .. 'k:wait:' .. key
end

-- Dependency edges (lib/dependencies.lua).
local function deps_key(id)
  return P .. 'deps:' .. id
end

local function needs_key(id)
  return P .. 'needs:' .. id
end

-- The job a dedup key currently names (lib/new_job.lua), or a pointer to it in another
-- partition (lib/identity.lua).
local function dedup_key(key)
  return P .. 'dd:' .. key
end

-- A partitioned queue's identities (lib/identity.lua): in a custom id's home, the pointer to
-- its job in another partition; in a job's partition, a fenced add's token.
local function id_pointer_key(id)
  return P .. 'idn:' .. id
end

local function fence_key(token)
  return P .. 'fence:' .. token
end

-- A schedule's definition (schedule_*.lua).
local function schedule_key(name)
  return P .. 'sched:' .. name
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function emit(ev, id, ...)
  redis.call('XADD', K_EVENTS, 'MAXLEN', '~', EVENTS_MAXLEN, '*', 'ev', ev, 'id', id, ...)
end

-- The queue's settings, read once per script (a script that changes them sets META = nil).
local META = nil
local function meta()
  if not META then
    local m = redis.call('HMGET', K_META, 'mode', 'kc', 'paused', 'rlm', 'rlp', 'rlk', 'kh',
      'pu', 'np', 'pi')
    META = {mode = m[1] or 'global', kc = tonumber(m[2] or '1'), paused = m[3],
            rate_max = tonumber(m[4] or '0'), rate_per = tonumber(m[5] or '0'),
            rate_per_key = m[6] == '1', history = tonumber(m[7] or HISTORY_MAXLEN),
            paused_until = m[8], partitions = tonumber(m[9] or '1'),
            partition = tonumber(m[10] or '0')}
  end
  return META
end

local function keyed()
  return meta().mode == 'keyed'
end

-- How many jobs this partition holds, in any state: a layout change (relayout.lua) and a
-- partition joining a layout (partition_problem) need none.
local function stored_jobs()
  local held = tonumber(redis.call('HGET', K_META, 'kw') or '0')
  for _, set in ipairs({K_WAIT, K_DELAYED, K_BLOCKED, K_ACTIVE, K_COMPLETED, K_FAILED,
                        K_CANCELLED}) do
    held = held + redis.call('ZCARD', set)
  end
  return held
end

-- The layout a client routes by, as it declares this partition ("<count>:<index>:<version>",
-- '' for whatever is stored; panqueue/_keys.py QueueKeys.declared). A partition in no layout
-- yet, or left in an older one and holding no job, joins the declared layout (store_partition,
-- once the caller goes ahead); otherwise the declaration must be the stored one. A client that
-- learned another layout is refused with 'layout changed' and reads the layout again, so no
-- job is written where the queue's layout does not look. Returns nil, or the problem.
local function partition_problem(declared)
  local count, index, version = string.match(declared, '^(%d+):(%d+):(%d+)$')
  if not count then
    return nil
  end
  local m = redis.call('HMGET', K_META, 'np', 'pi', 'lv')
  local stored = tonumber(m[3] or '0')
  if not m[1] or (m[1] == count and (m[2] or '0') == index and stored == tonumber(version)) then
    return nil
  end
  if stored < tonumber(version) and stored_jobs() == 0 then
    return nil
  end
  return 'layout changed: this partition is ' .. (m[2] or '0') .. ' of ' .. m[1]
    .. ' in layout version ' .. stored .. ', the caller routes by partition ' .. index .. ' of '
    .. count .. ' in version ' .. version
end

local function store_partition(declared)
  local count, index, version = string.match(declared, '^(%d+):(%d+):(%d+)$')
  if not count then
    return
  end
  local m = redis.call('HMGET', K_META, 'np', 'lv')
  if not m[1] or tonumber(m[2] or '0') < tonumber(version) then
    redis.call('HSET', K_META, 'np', count, 'pi', index, 'lv', version)
    META = nil
  end
end
