-- lib/layout.lua: the key layout of one queue and the job hash's fields; lib/calls.lua, pasted
-- at its end, has the server clock and the helpers of redis.call. Every script starts from
-- here (lib/settings.lua reads the queue's meta hash and writes events, as many as it says).
-- Needs: job_keys.lua (one job's keys, pasted below P), calls.lua (pasted at the end).
--
-- KEYS[1] is always the queue prefix "{q:<queue>}:"; every other key of the queue is derived
-- from it, so one script only ever touches one hash slot. panqueue/_keys.py names the same keys
-- for Python (tests/test_lua_layout.py holds the two together).
--
-- Job hash fields (job_key(id)):
--   d  data (msgpack; its parts d1..d7: lib/job_data.lua)   s  state   p  priority (absent: 0)
--   et enqueued at (ms)        st started at (ms)    ft finished at     a  attempts started
--   tk lock token (while active)   o  options (msgpack)   ws wait-set score kept by a claim
--   r  result (msgpack)        e  error (msgpack)    h  attempt history (concatenated msgpack)
--   fr failure reason          sc times stalled      cx cancel requested    sn times snoozed
--   x  deadline to start by (ms; add's expires=, lib/expiry.lua)   k  concurrency key (keyed)
--   pg progress (msgpack)      dd dedup key      ra run-at of a blocked job added with a delay
--   dx a dependency that was cancelled or deleted before it completed: the job can never run
--   dp the jobs it was added depending on, one a line (its flow's record: lib/dependencies.lua)
--   b  the batch the job belongs to (batch_*.lua; its ending goes to "batch_outbox")
--   ih partitioned queues: "<home partition>\t<token>" of the pointer in its custom id's home
--      partition (lib/identity.lua); deleting the job queues its removal ("id_outbox")
--   tg its tags, newline-separated, each indexed in ZSET "tag:<tag>" (job -> meta "tgn" rank)
-- Per job: "job:<id>:logs" (LIST, capped); its dependency edges and "flow:<id>", the jobs added
-- depending on it (lib/dependencies.lua); "job:<id>:durable" (HASH): a durable job's steps,
-- sleeps, waits and kept signals (its fields: step.lua's header).
--
-- History (STREAM "history"): one entry per finished job, appended by end_job (lib/finish.lua);
-- read by exports (panqueue.spark.export_history) through their consumer group.
-- Worker registry: ZSET "workers" (worker name -> when its entry expires, ms) and HASH
-- "worker_info" (worker name -> its record, msgpack); heartbeat.lua writes both, workers.lua
-- reads them and prunes the expired. LIST "control:<name>": commands for it (control.lua).
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
local K_WAIT_LIST = P .. 'wl'
local K_DELAYED = P .. 'delayed'
local K_BLOCKED = P .. 'blocked'
local K_ACTIVE = P .. 'active'
local K_COMPLETED = P .. 'completed'
local K_FAILED = P .. 'failed'
local K_CANCELLED = P .. 'cancelled'
local K_EVENTS = P .. 'events'
-- Set (with an expiry) while somebody reads the event stream, and while somebody waits on a
-- job's result or counts the ends of jobs (lib/settings.lua emit).
local K_EVENTS_READ = P .. 'events:read'
local K_ENDS_READ = P .. 'ends:read'
local K_NOTIFY = P .. 'notify'
local K_SCHEDULES = P .. 'schedules'
-- The schedules with ticks taken whose jobs belong in other partitions (ZSET: name -> when
-- taken, ms), each tick listed in its schedule's hash (schedule_tick.lua, schedule_done.lua).
local K_SCHEDULES_PENDING = P .. 'schedules:pending'
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

--!include job_keys.lua

-- A worker's commands (control.lua) and a tag's index (lib/new_job.lua, select.lua).
local function control_key(name)
  return P .. 'control:' .. name
end

-- What a call that a resend must not repeat did, under its request id (lib/memo.lua, the
-- signals of signal.lua, the commands a heartbeat took).
local function req_key(token)
  return P .. 'req:' .. token
end

local function tag_key(tag)
  return P .. 'tag:' .. tag
end

-- Keyed mode: the waiting jobs of one key (lib/waiting.lua).
local function key_list(key)
  return P .. 'k:wait:' .. key
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

--!include calls.lua
