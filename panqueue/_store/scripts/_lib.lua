-- Shared definitions, pasted at the top of every script by the loader (`--!include _lib.lua`).
--
-- KEYS[1] is always the queue prefix "{q:<queue>}:"; every other key of the queue is derived
-- from it, so one script only ever touches one hash slot.
--
-- Job hash fields (KEYS[1] .. "job:" .. id):
--   d  data (msgpack)          s  state              p  priority        ws wait-set score
--   et enqueued at (ms)        st started at (ms)    ft finished at     a  attempts started
--   tk lock token (while active)                     o  job options (msgpack, optional)
--   r  result (msgpack)        e  error (msgpack)    h  attempt history (concatenated msgpack)
--   fr failure reason          sc times stalled      cx cancel requested
--   pg progress (msgpack)      k  concurrency key (keyed mode)
--   dd dedup key               ra run-at of a blocked job that was added with a delay
--   dx a dependency that was cancelled or deleted before it completed: the job can never run
-- Per job: "job:<id>:logs" (LIST, capped); its dependency edges (see "Dependencies" below).
--
-- Queue meta (HASH "meta"): v schema version, mode (global|keyed), kc key concurrency,
-- seq (wait order), id (generated ids), paused, kw (waiting jobs in keyed lists),
-- rlm / rlp / rlk (rate limit: max, per ms, per key), rls (rate-limit entry counter).
--
-- Waiting jobs: global mode, ZSET "wait" (priority, then FIFO); keyed mode, the spec's layout:
-- LIST "k:wait:<key>" per key, HASH "k:active" key -> running count, ZSET "k:ready" of keys
-- that have waiting jobs and free capacity (score = seq: round robin), ZSET "k:limited" of keys
-- paused by their per-key rate limit (score = when they may start again).
-- All times come from the server clock (TIME), never from a worker host.
--
-- Dependencies: an edge A -> B (B waits for A) is recorded on both sides, "deps:A" (SET of the
-- jobs waiting for A) and "needs:B" (SET of B's dependencies that have not completed). Both
-- sides are written and removed together: B is in deps:A exactly when A is in needs:B. An
-- edge lives while A may still complete and B may still need it: it goes when A completes
-- (release_dependents), when A will never complete (cancelled, deleted: forget_dependents),
-- and when B will never run (cancelled, deleted: unlink_needs). A dependent that failed
-- because A failed keeps its edges, so that a retry of both knows B must wait for A.

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
local K_READY = P .. 'k:ready'
local K_KACTIVE = P .. 'k:active'
local K_LIMITED = P .. 'k:limited'
local K_RATE = P .. 'rl'
local EVENTS_MAXLEN = 10000
local PROMOTE_BATCH = 1000
local MAX_PRIORITY = 1000000
-- The wait order (global mode) of a job is its sequence number below 2^32 (see wait_score).
local WAIT_SEQ_SPAN = 4294967296
-- Times and durations an add may carry (ms): 2^52 ms is about 142,000 years. Any such value,
-- added to the server's clock, is still an exact integer in a double, Redis formats it without
-- an exponent, and PX / PEXPIRE accept it.
local MAX_TIME_MS = 4503599627370496

local function job_key(id)
  return P .. 'job:' .. id
end

local function key_list(key)
  return P .. 'k:wait:' .. key
end

local function deps_key(id)
  return P .. 'deps:' .. id
end

local function needs_key(id)
  return P .. 'needs:' .. id
end

-- Defined below, with the dependency helpers it uses (trim_finished calls it first).
local delete_job

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function emit(ev, id, ...)
  redis.call('XADD', K_EVENTS, 'MAXLEN', '~', EVENTS_MAXLEN, '*', 'ev', ev, 'id', id, ...)
end

-- The queue's settings, read once per script.
local META = nil
local function meta()
  if not META then
    local m = redis.call('HMGET', K_META, 'mode', 'kc', 'paused', 'rlm', 'rlp', 'rlk')
    META = {mode = m[1] or 'global', kc = tonumber(m[2] or '1'), paused = m[3],
            rate_max = tonumber(m[4] or '0'), rate_per = tonumber(m[5] or '0'),
            rate_per_key = m[6] == '1'}
  end
  return META
end

local function keyed()
  return meta().mode == 'keyed'
end

-- How many claimable units there are (jobs in global mode, ready keys in keyed mode). Idle
-- workers are woken when this goes from zero to non-zero: a worker goes idle only after a claim
-- found nothing, so the change after that is always announced (see docs/concepts.md).
local function claimable()
  if keyed() then
    return redis.call('ZCARD', K_READY)
  end
  return redis.call('ZCARD', K_WAIT)
end

local function wake_workers()
  redis.call('SPUBLISH', K_NOTIFY, 'w')
end

local function wake_if_work_appeared(before)
  if before == 0 and claimable() > 0 then
    wake_workers()
  end
end

-- Higher priority first, FIFO (by seq) within a priority. Exact in a double: the priority part
-- is below 2^21 and the sequence part below 2^32 (next_wait_seq keeps it there).
local function wait_score(priority, seq)
  return string.format('%d', (MAX_PRIORITY - priority) * WAIT_SEQ_SPAN + seq)
end

-- The next wait sequence number. It would pass 2^32 after 4 billion enqueues; before it does,
-- the jobs that hold a place in the wait order are renumbered 1..n in the order they hold, and
-- the count restarts after them. Those jobs are the waiting ones and the active ones (a
-- stalled or released job goes back to its stored place, see requeue_waiting). This costs
-- one pass over them, once per 2^32 enqueues; every other enqueue stays O(log n).
local function next_wait_seq()
  local seq = redis.call('HINCRBY', K_META, 'seq', 1)
  if seq < WAIT_SEQ_SPAN then
    return seq
  end
  local held = {}
  local waiting = redis.call('ZRANGE', K_WAIT, 0, -1, 'WITHSCORES')
  for i = 1, #waiting, 2 do
    held[#held + 1] = {id = waiting[i], score = tonumber(waiting[i + 1]), waiting = true}
  end
  for _, id in ipairs(redis.call('ZRANGE', K_ACTIVE, 0, -1)) do
    local ws = redis.call('HGET', job_key(id), 'ws')
    if ws then
      held[#held + 1] = {id = id, score = tonumber(ws), waiting = false}
    end
  end
  -- Order by the old sequence number alone: priorities keep their part of the score.
  table.sort(held, function(a, b)
    return a.score % WAIT_SEQ_SPAN < b.score % WAIT_SEQ_SPAN
  end)
  for n, job in ipairs(held) do
    local priority_part = math.floor(job.score / WAIT_SEQ_SPAN)
    local ws = string.format('%d', priority_part * WAIT_SEQ_SPAN + n)
    redis.call('HSET', job_key(job.id), 'ws', ws)
    if job.waiting then
      redis.call('ZADD', K_WAIT, ws, job.id)
    end
  end
  redis.call('HSET', K_META, 'seq', #held + 1)
  return #held + 1
end

-- The readiness invariant of keyed mode, checked on every path that changes a key: a key is in
-- the ready set exactly when it has waiting jobs, free capacity and no rate-limit pause. A key
-- with nothing waiting and nothing running leaves no structures behind.
local function refresh_key(key)
  local waiting = redis.call('LLEN', key_list(key))
  local active = tonumber(redis.call('HGET', K_KACTIVE, key) or '0')
  if waiting > 0 and active < meta().kc and not redis.call('ZSCORE', K_LIMITED, key) then
    if not redis.call('ZSCORE', K_READY, key) then
      redis.call('ZADD', K_READY, redis.call('HINCRBY', K_META, 'seq', 1), key)
    end
  else
    redis.call('ZREM', K_READY, key)
  end
  if waiting == 0 and active <= 0 then
    redis.call('HDEL', K_KACTIVE, key)
  end
end

-- Put a job into waiting, behind the others (of its priority / of its key).
local function enqueue_waiting(jkey, id)
  redis.call('HSET', jkey, 's', 'waiting')
  if keyed() then
    local key = redis.call('HGET', jkey, 'k')
    redis.call('RPUSH', key_list(key), id)
    redis.call('HINCRBY', K_META, 'kw', 1)
    refresh_key(key)
    return
  end
  local priority = tonumber(redis.call('HGET', jkey, 'p') or '0') or 0
  local ws = wait_score(priority, next_wait_seq())
  redis.call('HSET', jkey, 'ws', ws)
  redis.call('ZADD', K_WAIT, ws, id)
end

-- Put a job back at the front (a stalled or released job goes before later arrivals).
local function requeue_waiting(jkey, id)
  if keyed() then
    redis.call('HSET', jkey, 's', 'waiting')
    local key = redis.call('HGET', jkey, 'k')
    redis.call('LPUSH', key_list(key), id)
    redis.call('HINCRBY', K_META, 'kw', 1)
    refresh_key(key)
    return
  end
  local ws = redis.call('HGET', jkey, 'ws')
  if not ws then
    enqueue_waiting(jkey, id)
    return
  end
  redis.call('HSET', jkey, 's', 'waiting')
  redis.call('ZADD', K_WAIT, ws, id)
end

-- Take a job out of waiting (cancel, remove, dedup replace).
local function unwait(jkey, id)
  if keyed() then
    local key = redis.call('HGET', jkey, 'k')
    if redis.call('LREM', key_list(key), 1, id) > 0 then
      redis.call('HINCRBY', K_META, 'kw', -1)
    end
    refresh_key(key)
    return
  end
  redis.call('ZREM', K_WAIT, id)
end

-- A running job stops running (finished, failed, stalled, released): free its key's slot.
local function leave_active(jkey, id)
  redis.call('ZREM', K_ACTIVE, id)
  redis.call('HDEL', jkey, 'tk')
  if keyed() then
    local key = redis.call('HGET', jkey, 'k')
    if key then
      if redis.call('HINCRBY', K_KACTIVE, key, -1) < 0 then
        redis.call('HSET', K_KACTIVE, key, 0)
      end
      refresh_key(key)
    end
  end
end

-- Take a job out of whatever non-active state it is in (for cancel / remove / replace).
local function detach(jkey, id, state)
  if state == 'waiting' then
    unwait(jkey, id)
  elseif state == 'delayed' then
    redis.call('ZREM', K_DELAYED, id)
  elseif state == 'blocked' then
    redis.call('ZREM', K_BLOCKED, id)
  end
end

-- Move due delayed jobs into waiting. Returns how many moved.
local function promote_due(now)
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', now, 'LIMIT', 0, PROMOTE_BATCH)
  if #due == 0 then
    return 0
  end
  redis.call('ZREM', K_DELAYED, unpack(due))
  for _, id in ipairs(due) do
    enqueue_waiting(job_key(id), id)
    emit('waiting', id)
  end
  return #due
end

-- Milliseconds until the next delayed job is due, or -1 if there is none.
local function wake_in(now)
  local first = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')
  if #first == 0 then
    return -1
  end
  return math.max(0, tonumber(first[2]) - now)
end

local function earliest(a, b)
  if a < 0 then
    return b
  end
  if b < 0 then
    return a
  end
  return math.min(a, b)
end

-- Sliding-window rate limit: how many more starts the window allows now, and when (ms from
-- now) the next start is allowed when none is. Entries older than the window are dropped.
local function rate_allowance(rkey, now)
  local m = meta()
  redis.call('ZREMRANGEBYSCORE', rkey, '-inf', now - m.rate_per)
  local room = m.rate_max - redis.call('ZCARD', rkey)
  if room > 0 then
    return room, -1
  end
  local oldest = redis.call('ZRANGE', rkey, 0, 0, 'WITHSCORES')
  return 0, math.max(1, tonumber(oldest[2]) + m.rate_per - now)
end

local function rate_record(rkey, now)
  redis.call('ZADD', rkey, now, redis.call('HINCRBY', K_META, 'rls', 1))
  redis.call('PEXPIRE', rkey, meta().rate_per + 1000)
end

-- Keys paused by their per-key rate limit whose pause is over become claimable again.
local function release_limited_keys(now)
  local due = redis.call('ZRANGEBYSCORE', K_LIMITED, '-inf', now, 'LIMIT', 0, PROMOTE_BATCH)
  for _, key in ipairs(due) do
    redis.call('ZREM', K_LIMITED, key)
    refresh_key(key)
  end
end

-- WAITING -> ACTIVE with the lock token and a lock deadline, in one step (a sweeper can never
-- see a job that is claimed but not yet locked). Appends the job to `out`.
local function activate(id, now, token, ttl, out)
  local jkey = job_key(id)
  local attempt = redis.call('HINCRBY', jkey, 'a', 1)
  redis.call('HSET', jkey, 's', 'active', 'st', now, 'tk', token)
  redis.call('ZADD', K_ACTIVE, now + ttl, id)
  local f = redis.call('HMGET', jkey, 'd', 'et', 'o')
  out[#out + 1] = id
  out[#out + 1] = f[1]
  out[#out + 1] = attempt
  out[#out + 1] = f[2]
  out[#out + 1] = f[3] or ''
  emit('active', id, 'a', attempt)
end

-- Claim up to n jobs for one worker (its free slots). Appends to `out`: count, wake_in (when
-- nothing was claimed: ms until something may be claimable, -1 unknown), then per job
-- id, data, attempt, enqueued_at, options. Honours pause, the rate limit and keyed mode.
local function claim(now, token, ttl, n, out)
  local count_at = #out + 1
  out[count_at] = 0
  out[count_at + 1] = -1
  local m = meta()
  if n <= 0 or m.paused then
    return
  end
  promote_due(now)
  local global_limit = m.rate_max > 0 and not m.rate_per_key
  if global_limit then
    local room, retry_in = rate_allowance(K_RATE, now)
    if room == 0 then
      out[count_at + 1] = earliest(retry_in, wake_in(now))
      return
    end
    n = math.min(n, room)
  end
  local count = 0
  if keyed() then
    local key_limit = m.rate_max > 0 and m.rate_per_key
    release_limited_keys(now)
    while count < n do
      local popped = redis.call('ZPOPMIN', K_READY)
      if #popped == 0 then
        break
      end
      local key = popped[1]
      local id = redis.call('LPOP', key_list(key))
      if id then
        redis.call('HINCRBY', K_META, 'kw', -1)
        local running = redis.call('HINCRBY', K_KACTIVE, key, 1)
        activate(id, now, token, ttl, out)
        count = count + 1
        if global_limit then
          rate_record(K_RATE, now)
        end
        if key_limit then
          local rkey = K_RATE .. ':' .. key
          rate_record(rkey, now)
          local room, retry_in = rate_allowance(rkey, now)
          if room == 0 then
            redis.call('ZADD', K_LIMITED, now + retry_in, key)
          end
        end
        -- Back of the round robin with a new sequence number, if still eligible (a key now
        -- at capacity is not: it was popped and stays out until a job of it finishes).
        if running < m.kc then
          refresh_key(key)
        end
      else
        refresh_key(key)
      end
    end
  else
    local popped = redis.call('ZPOPMIN', K_WAIT, n)
    for i = 1, #popped, 2 do
      activate(popped[i], now, token, ttl, out)
      count = count + 1
      if global_limit then
        rate_record(K_RATE, now)
      end
    end
  end
  out[count_at] = count
  if count == 0 then
    -- Only an empty claim says when to look again (the busy path skips these reads): the next
    -- delayed job, or the first key whose per-key rate limit runs out.
    local next_in = wake_in(now)
    local first = redis.call('ZRANGE', K_LIMITED, 0, 0, 'WITHSCORES')
    if #first > 0 then
      next_in = earliest(next_in, math.max(1, tonumber(first[2]) - now))
    end
    out[count_at + 1] = next_in
  end
end

-- Keep at most `keep` members in a finished set (completed / failed / cancelled), deleting the
-- oldest jobs. keep < 0 keeps everything. Deleting a job can fail jobs still blocked on it
-- (see delete_job), which adds them to the failed set: trim until it is within bounds.
local function trim_finished(set, keep, now)
  if keep < 0 then
    return
  end
  local excess = redis.call('ZCARD', set) - keep
  while excess > 0 do
    local old = redis.call('ZPOPMIN', set, excess)
    for i = 1, #old, 2 do
      delete_job(old[i], now)
    end
    excess = redis.call('ZCARD', set) - keep
  end
end

-- A job enters its final set (without retention: see finish).
local function record_final(jkey, id, set, state, now)
  redis.call('HSET', jkey, 's', state, 'ft', now)
  redis.call('ZADD', set, now, id)
end

-- The edges of dependent `id` to its dependencies go: it will never run (cancelled, deleted).
local function unlink_needs(id)
  local nkey = needs_key(id)
  for _, dep in ipairs(redis.call('SMEMBERS', nkey)) do
    redis.call('SREM', deps_key(dep), id)
  end
  redis.call('DEL', nkey)
end

-- Dependencies: a job that completed releases the jobs blocked on it (the last dependency to
-- complete moves a blocked job to waiting). A dependent that failed with it earlier learns
-- that it completed, for a later retry.
local function release_dependents(id, now)
  local dkey = deps_key(id)
  for _, dependent in ipairs(redis.call('SMEMBERS', dkey)) do
    local nkey = needs_key(dependent)
    redis.call('SREM', nkey, id)
    local djkey = job_key(dependent)
    if redis.call('HGET', djkey, 's') == 'blocked' and redis.call('SCARD', nkey) == 0 then
      redis.call('ZREM', K_BLOCKED, dependent)
      local run_at = tonumber(redis.call('HGET', djkey, 'ra') or '0')
      if run_at > now then
        redis.call('HSET', djkey, 's', 'delayed')
        redis.call('ZADD', K_DELAYED, run_at, dependent)
        emit('delayed', dependent, 'why', 'dependencies_completed')
      else
        enqueue_waiting(djkey, dependent)
        emit('waiting', dependent, 'why', 'dependencies_completed')
      end
    end
  end
  redis.call('DEL', dkey)
end

-- A job that will not complete now (failed, cancelled, removed) fails every job blocked on
-- it, transitively, with reason "dependency_failed". The edges stay (see "Dependencies"
-- above). Retention is applied once the whole cascade is recorded: trimming in the middle of
-- it would delete a dependent before its own dependents were failed.
local function fail_dependents(id, now, keep)
  local pending = {id}
  local i = 1
  while i <= #pending do
    for _, dependent in ipairs(redis.call('SMEMBERS', deps_key(pending[i]))) do
      local djkey = job_key(dependent)
      if redis.call('HGET', djkey, 's') == 'blocked' then
        redis.call('ZREM', K_BLOCKED, dependent)
        local err = cmsgpack.pack({type = 'DependencyFailed',
          message = 'dependency ' .. pending[i] .. ' did not complete'})
        redis.call('HSET', djkey, 'e', err, 'fr', 'dependency_failed')
        emit('failed', dependent, 'e', err, 'fr', 'dependency_failed')
        record_final(djkey, dependent, K_FAILED, 'failed', now)
        pending[#pending + 1] = dependent
      end
    end
    i = i + 1
  end
  if #pending > 1 then
    trim_finished(K_FAILED, keep, now)
  end
end

-- Job `id` will never complete (cancelled, or deleted): the jobs still blocked on it fail, and
-- every dependent forgets it and is marked (dx) so that no retry can move it back. A job that
-- later reuses the id starts with no edge.
local function forget_dependents(id, now)
  fail_dependents(id, now, -1)
  local dkey = deps_key(id)
  for _, dependent in ipairs(redis.call('SMEMBERS', dkey)) do
    local djkey = job_key(dependent)
    if redis.call('EXISTS', djkey) == 1 then
      redis.call('HSET', djkey, 'dx', id)
    end
    unlink_needs(dependent)
  end
  redis.call('DEL', dkey)
end

-- Delete a job: its hash, its log list and its dependency edges on both sides. (Most deleted
-- jobs have no edge left: one EXISTS finds out, on the path retention takes at every finish.)
delete_job = function(id, now)
  if redis.call('EXISTS', deps_key(id), needs_key(id)) > 0 then
    forget_dependents(id, now or now_ms())
    unlink_needs(id)
  end
  local jkey = job_key(id)
  redis.call('DEL', jkey, jkey .. ':logs')
end

-- Record a finished job in its final set. A cancelled job will never complete nor run: its
-- dependency edges go.
local function finish(jkey, id, set, state, now, keep)
  record_final(jkey, id, set, state, now)
  if state == 'cancelled' then
    forget_dependents(id, now)
    unlink_needs(id)
  end
  trim_finished(set, keep, now)
end

-- The queue's concurrency mode for an add: the stored one, else the producer's declaration,
-- else global. Returns mode or nil, error message.
local function resolve_mode(declared)
  local stored = redis.call('HGET', K_META, 'mode')
  if stored and declared ~= '' and declared ~= stored then
    return nil, 'queue mode mismatch: the queue is ' .. stored .. ', the producer says ' .. declared
  end
  return stored or (declared ~= '' and declared) or 'global', nil
end

-- Whether `value` is a whole number in [low, high] (false for nil, NaN and the infinities).
local function whole_in(value, low, high)
  return value ~= nil and value == math.floor(value) and value >= low and value <= high
end

-- What is wrong with one job to add (`f` as add_job takes it), or nil. The add script checks
-- every item of a batch before it writes any: a value Redis would refuse half-way through
-- (a PX out of range, say) must not leave half a batch behind.
local function new_job_problem(f)
  if not whole_in(f.priority, -MAX_PRIORITY, MAX_PRIORITY) then
    return 'priority must be a whole number between -' .. MAX_PRIORITY .. ' and ' .. MAX_PRIORITY
  elseif not whole_in(f.delay, 0, MAX_TIME_MS) then
    return 'delay must be a whole number of ms between 0 and 2^52'
  elseif not whole_in(f.run_at, -MAX_TIME_MS, MAX_TIME_MS) then
    return 'run_at must be a whole number of ms since the epoch, at most 2^52 either way'
  elseif f.dedup ~= '' and not whole_in(f.ttl, 1, MAX_TIME_MS) then
    return 'dedup ttl must be a whole number of ms between 1 and 2^52'
  elseif f.dedup ~= '' and f.strategy ~= 'keep' and f.strategy ~= 'replace'
      and f.strategy ~= 'extend' then
    return 'dedup strategy must be keep, replace or extend'
  end
  return nil
end

-- Create one job: WAITING, DELAYED or BLOCKED (or FAILED at once when a dependency already
-- failed, was cancelled or no longer exists). `f` holds the fields the add script validated.
-- Returns id, created (0 when a job with that id, or a live duplicate under its dedup key,
-- exists: it is returned unchanged).
local function add_job(now, f)
  if f.id ~= '' and redis.call('EXISTS', job_key(f.id)) == 1 then
    return f.id, 0  -- idempotent custom id: checked first, so a dedup replace cannot lose it
  end
  local dkey = nil
  if f.dedup ~= '' then
    dkey = P .. 'dd:' .. f.dedup
    local existing = redis.call('GET', dkey)
    if existing and redis.call('EXISTS', job_key(existing)) == 1 then
      if f.strategy == 'keep' then
        return existing, 0
      elseif f.strategy == 'extend' then
        redis.call('PEXPIRE', dkey, f.ttl)
        return existing, 0
      end
      -- replace: a job that has not started yet is replaced; a started one is left to run.
      local ejkey = job_key(existing)
      local state = redis.call('HGET', ejkey, 's')
      if state == 'waiting' or state == 'delayed' or state == 'blocked' then
        detach(ejkey, existing, state)
        delete_job(existing, now)  -- fails the jobs blocked on it
        emit('removed', existing, 'why', 'replaced')
      end
    end
  end
  local id = f.id
  if id == '' then
    id = tostring(redis.call('HINCRBY', K_META, 'id', 1))
  end
  local jkey = job_key(id)
  local run_at = f.run_at
  if run_at == 0 and f.delay > 0 then
    run_at = now + f.delay
  end
  redis.call('HSET', jkey, 'd', f.data, 'p', f.priority, 'et', now, 'a', 0)
  if f.options ~= '' then
    redis.call('HSET', jkey, 'o', f.options)
  end
  if f.key ~= '' then
    redis.call('HSET', jkey, 'k', f.key)
  end
  if dkey then
    redis.call('HSET', jkey, 'dd', f.dedup)
    redis.call('SET', dkey, id, 'PX', f.ttl)
  end
  -- Each distinct dependency that has not completed is an edge (a set: naming one twice
  -- makes one edge). One that failed may still be retried: the job fails now but keeps the
  -- edge. One that was cancelled or no longer exists (removed earlier in the same batch, say)
  -- will never complete: the job fails and can never run (dx).
  local waiting, failed_dep, lost_dep, lost_state = false, nil, nil, nil
  for _, dep in ipairs(f.deps) do
    local state = redis.call('HGET', job_key(dep), 's')
    if state == 'cancelled' or not state then
      if not lost_dep then
        lost_dep, lost_state = dep, state
      end
    elseif state ~= 'completed' then
      redis.call('SADD', needs_key(id), dep)
      redis.call('SADD', deps_key(dep), id)
      if state == 'failed' then
        failed_dep = failed_dep or dep
      else
        waiting = true
      end
    end
  end
  if lost_dep or failed_dep then
    local message = 'dependency ' .. (lost_dep or failed_dep) .. ' did not complete'
    if lost_dep then
      redis.call('HSET', jkey, 'dx', lost_dep)
      unlink_needs(id)
      if not lost_state then
        message = 'dependency ' .. lost_dep .. ' no longer exists'
      end
    end
    local err = cmsgpack.pack({type = 'DependencyFailed', message = message})
    redis.call('HSET', jkey, 'e', err, 'fr', 'dependency_failed')
    emit('added', id, 's', 'failed')
    finish(jkey, id, K_FAILED, 'failed', now, -1)
  elseif waiting then
    redis.call('HSET', jkey, 's', 'blocked')
    if run_at > now then
      redis.call('HSET', jkey, 'ra', run_at)  -- released into DELAYED if still in the future
    end
    redis.call('ZADD', K_BLOCKED, now, id)
    emit('added', id, 's', 'blocked')
  elseif run_at > now then
    redis.call('HSET', jkey, 's', 'delayed')
    redis.call('ZADD', K_DELAYED, run_at, id)
    emit('added', id, 's', 'delayed')
    -- Idle workers sleep until the earliest delayed job: tell them when that moves.
    local first = redis.call('ZRANGE', K_DELAYED, 0, 0)
    if first[1] == id then
      wake_workers()
    end
  else
    enqueue_waiting(jkey, id)
    emit('added', id, 's', 'waiting')
  end
  return id, 1
end
