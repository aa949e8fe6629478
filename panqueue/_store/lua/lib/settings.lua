-- lib/settings.lua: the queue's settings, its meta hash, read once per script.
-- Needs: layout.lua.
--
-- Queue meta (HASH "meta"): v schema version, mode (global|keyed), kc key concurrency,
-- kf failed/cancelled jobs kept (for producers' cancels), seq (wait order), id (generated ids),
-- paused, kw (waiting jobs in keyed lists), rlm / rlp / rlk (rate limit: max, per ms, per key),
-- rls (rate-limit entry counter), kh (history records kept: Retention.history; 0 = none),
-- ke (events kept: Retention.events; 0 = only the events of a job's end, see emit),
-- ka (Retention.events_always: '1' writes every event even while nobody reads them, see emit),
-- pu (global mode: no job starts before this time, ms: a handler raised RateLimited,
-- rate_limited.lua), np / pi / lv (partitioned queues: the partition count, this partition's
-- index and the version of the layout they belong to; absent: 1, 0 and 0; np 0: a partition
-- that a layout change left out; a generated id is id counter * np + pi, so id % np names the
-- partition, panqueue/_keys.py route), pl (the home's: how the partitions are named,
-- panqueue/_keys.py partition_tags; absent: the "#i" suffixes of queues declared before it).
--!include layout.lua

-- The defaults of a queue no worker has set up (panqueue/_store/ops/base.py has the same
-- figures; tests/test_lua_contract.py holds them together).
local HISTORY_MAXLEN = 100000  -- kh: Retention.history's default
local EVENTS_MAXLEN = 10000    -- ke: Retention.events' default
local KEEP_FAILED = 10000      -- kf: Retention.failed's default (failed and cancelled jobs)
local KEY_CONCURRENCY = 1      -- kc: a handler's key_concurrency default

-- The queue's settings, read once per script (a script that changes them sets META = nil).
local META = nil
local function meta()
  if not META then
    local m = redis.call('HMGET', K_META, 'mode', 'kc', 'paused', 'rlm', 'rlp', 'rlk', 'kh',
      'pu', 'np', 'pi', 'ke', 'lv', 'ka')
    META = {mode = m[1] or 'global', kc = tonumber(m[2] or KEY_CONCURRENCY), paused = m[3],
            rate_max = tonumber(m[4] or '0'), rate_per = tonumber(m[5] or '0'),
            rate_per_key = m[6] == '1', history = tonumber(m[7] or HISTORY_MAXLEN),
            paused_until = m[8], partitions = tonumber(m[9] or '1'),
            partition = tonumber(m[10] or '0'), events = tonumber(m[11] or EVENTS_MAXLEN),
            -- the mode as stored, false when absent (lib/new_job_checks.lua resolve_mode);
            -- whether a layout is stored, and its version (lib/partition.lua)
            stored_mode = m[1], layout_stored = m[9] ~= false,
            layout_version = tonumber(m[12] or '0'), events_always = m[13] == '1'}
  end
  return META
end

local function keyed()
  return meta().mode == 'keyed'
end

-- How many cancelled jobs the queue keeps: what its workers set (kf), else Retention's default.
local function cancelled_keep()
  return tonumber(redis.call('HGET', K_META, 'kf') or KEEP_FAILED)
end

-- The events of a job's end (completed, failed, cancelled): what result() waits on
-- (panqueue/_store/ops/jobs.py wait_result) and what the rates of `panqueue top` and the
-- dashboard count. A queue that keeps no other events (Retention(events=0), ke 0) keeps about
-- ENDINGS_KEPT of them.
local ENDINGS = {completed = true, failed = true, cancelled = true}
local ENDINGS_KEPT = 1000

-- Whether the queue's other events are written now: while somebody reads the stream (a reader
-- sets K_EVENTS_READ with an expiry: panqueue/_store/ops/events.py watch), or always
-- (Retention(events_always=True)). Asked once per script.
local WATCHED = nil
local function watched()
  if WATCHED == nil then
    WATCHED = meta().events_always or redis.call('EXISTS', K_EVENTS_READ) == 1
  end
  return WATCHED
end

-- Whether the events of a job's end are written now: while somebody waits on a result or
-- counts ends (K_ENDS_READ, set with an expiry by result() and by readers that only count),
-- or reads every event (K_EVENTS_READ), or always. Asked once per script.
local ENDS_WATCHED = nil
local function ends_watched()
  if ENDS_WATCHED == nil then
    ENDS_WATCHED = WATCHED or meta().events_always
      or redis.call('EXISTS', K_ENDS_READ, K_EVENTS_READ) > 0
  end
  return ENDS_WATCHED
end

-- Event `ev` of job `id` (or of the queue: id ''), with its fields, into the event stream
-- (docs/job-control.md#the-event-stream), which keeps about meta().events entries. An event
-- that is not a job's end is written only while the stream is watched(), a job's end while
-- ends_watched() or when `always` (lib/finish.lua end_job: a job whose finished set keeps none
-- has its outcome left only in this event, for a result() of an earlier version, which does
-- not ask for the ends).
local function emit_event(always, ev, id, ...)
  local kept = meta().events
  if not ENDINGS[ev] then
    if kept == 0 or not watched() then
      return
    end
  else
    if not (always or ends_watched()) then
      return
    end
    if kept == 0 then
      kept = ENDINGS_KEPT
    end
  end
  append_capped(K_EVENTS, kept, 'ev', ev, 'id', id, ...)
end

local function emit(ev, id, ...)
  emit_event(false, ev, id, ...)
end
