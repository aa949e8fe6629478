-- lib/waiting.lua: where a job waits before it runs and how it gets there. The wait order
-- (wait_score, and its renumbering before it overflows), putting a job into waiting (at the back
-- or at its old place) and taking it out, the readiness of keyed mode's keys and the slot a
-- running job holds in its key, promotion of due delayed jobs, and waking idle workers.
-- Needs: layout.lua.
--
-- Waiting jobs: global mode, ZSET "wait" (priority, then FIFO); keyed mode, the spec's layout:
-- LIST "k:wait:<key>" per key, HASH "k:active" key -> running count, ZSET "k:ready" of keys
-- that have waiting jobs and free capacity (score = seq: round robin), ZSET "k:limited" of keys
-- paused by their per-key rate limit (score = when they may start again).
-- Delayed jobs: ZSET "delayed" (score = when due); blocked jobs: ZSET "blocked" (they wait for
-- dependencies, lib/dependencies.lua).
--!include layout.lua

local PROMOTE_BATCH = 1000
local MAX_PRIORITY = 1000000
-- The wait order (global mode) of a job is its sequence number below 2^32 (see wait_score).
local WAIT_SEQ_SPAN = 4294967296

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
    if job.waiting then
      redis.call('ZADD', K_WAIT, ws, job.id)
    else
      redis.call('HSET', job_key(job.id), 'ws', ws)
    end
  end
  redis.call('HSET', K_META, 'seq', #held + 1)
  return #held + 1
end

-- The readiness invariant of keyed mode, checked on every path that changes a key: a key is in
-- the ready set exactly when it has waiting jobs, free capacity and no rate-limit pause. A key
-- with nothing waiting and nothing running leaves no structures behind. `active`: the key's
-- running count when the caller has just read or changed it (saves reading it again).
-- `popped`: the caller has just taken the key out of the ready set (a claim), so it is not in it.
local function refresh_key(key, active, popped)
  local waiting = redis.call('LLEN', key_list(key))
  active = active or tonumber(redis.call('HGET', K_KEY_ACTIVE, key) or '0')
  if waiting > 0 and active < meta().kc and not redis.call('ZSCORE', K_LIMITED, key) then
    if popped or not redis.call('ZSCORE', K_READY, key) then
      redis.call('ZADD', K_READY, redis.call('HINCRBY', K_META, 'seq', 1), key)
    end
  elseif not popped then
    redis.call('ZREM', K_READY, key)
  end
  if waiting == 0 and active <= 0 then
    redis.call('HDEL', K_KEY_ACTIVE, key)
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
  -- The place is kept in the wait set alone; a claim copies it to the job ("ws"), so that a
  -- stalled or released job can go back to it (requeue_waiting).
  redis.call('ZADD', K_WAIT, wait_score(priority, next_wait_seq()), id)
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

-- A running job stops running (finished, failed, stalled, released): its lock goes (with the
-- other job hash fields named in `...`, in the same command) and its key's slot is freed.
local function leave_active(jkey, id, ...)
  redis.call('ZREM', K_ACTIVE, id)
  redis.call('HDEL', jkey, 'tk', ...)
  if keyed() then
    local key = redis.call('HGET', jkey, 'k')
    if key then
      local active = redis.call('HINCRBY', K_KEY_ACTIVE, key, -1)
      if active < 0 then
        active = 0
        redis.call('HSET', K_KEY_ACTIVE, key, 0)
      end
      refresh_key(key, active)
    end
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
