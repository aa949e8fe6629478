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
--   pg progress (msgpack)
-- Job logs: list KEYS[1] .. "job:" .. id .. ":logs" (capped).
-- All times come from the server clock (TIME), never from a worker host.

local P = KEYS[1]
local K_META = P .. 'meta'
local K_WAIT = P .. 'wait'
local K_DELAYED = P .. 'delayed'
local K_ACTIVE = P .. 'active'
local K_COMPLETED = P .. 'completed'
local K_FAILED = P .. 'failed'
local K_CANCELLED = P .. 'cancelled'
local K_EVENTS = P .. 'events'
local K_NOTIFY = P .. 'notify'
local EVENTS_MAXLEN = 10000
local PROMOTE_BATCH = 1000

local function job_key(id)
  return P .. 'job:' .. id
end

-- A job is its hash plus its log list.
local function delete_job(id)
  local jkey = job_key(id)
  redis.call('DEL', jkey, jkey .. ':logs')
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function emit(ev, id, ...)
  redis.call('XADD', K_EVENTS, 'MAXLEN', '~', EVENTS_MAXLEN, '*', 'ev', ev, 'id', id, ...)
end

-- Wake idle workers. Callers publish only when the wait set goes from empty to non-empty:
-- a worker goes idle only after a claim saw nothing to take, so the next add after that sees an
-- empty set and publishes (see docs/concepts.md, "Wake-up").
local function wake_workers()
  redis.call('SPUBLISH', K_NOTIFY, 'w')
end

-- Higher priority first, FIFO (by seq) within a priority. Exact in a double: the priority part
-- is below 2^21 and the sequence part below 2^32.
local function wait_score(priority, seq)
  return string.format('%d', (1000000 - priority) * 4294967296 + (seq % 4294967296))
end

-- Put a job into the wait set at the back of its priority.
local function enqueue_waiting(jkey, id)
  local priority = tonumber(redis.call('HGET', jkey, 'p') or '0') or 0
  local seq = redis.call('HINCRBY', K_META, 'seq', 1)
  local ws = wait_score(priority, seq)
  redis.call('HSET', jkey, 's', 'waiting', 'ws', ws)
  redis.call('ZADD', K_WAIT, ws, id)
end

-- Put a job back at the position it had (stalled or released jobs go before later arrivals).
local function requeue_waiting(jkey, id)
  local ws = redis.call('HGET', jkey, 'ws')
  if not ws then
    enqueue_waiting(jkey, id)
    return
  end
  redis.call('HSET', jkey, 's', 'waiting')
  redis.call('ZADD', K_WAIT, ws, id)
end

-- Move due delayed jobs into the wait set. Returns how many moved.
local function promote_due(now)
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', now, 'LIMIT', 0, PROMOTE_BATCH)
  if #due == 0 then
    return 0
  end
  for _, id in ipairs(due) do
    enqueue_waiting(job_key(id), id)
    emit('waiting', id)
  end
  redis.call('ZREM', K_DELAYED, unpack(due))
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

-- Claim up to n waiting jobs: each moves WAITING -> ACTIVE with the lock token and a lock
-- deadline in the active set, in this one atomic step (a sweeper can never see a job that is
-- claimed but not yet locked). Appends to `out`: count, wake_in, then per job
-- id, data, attempt, enqueued_at, options.
local function claim(now, token, ttl, n, out)
  local count_at = #out + 1
  out[count_at] = 0
  out[count_at + 1] = -1
  if n <= 0 then
    return
  end
  if redis.call('HEXISTS', K_META, 'paused') == 1 then
    return
  end
  promote_due(now)
  local popped = redis.call('ZPOPMIN', K_WAIT, n)
  local count = 0
  for i = 1, #popped, 2 do
    local id = popped[i]
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
    count = count + 1
  end
  out[count_at] = count
  if count == 0 then
    out[count_at + 1] = wake_in(now)
  end
end

-- Keep at most `keep` members in a finished set (completed / failed / cancelled), deleting the
-- oldest jobs' hashes. keep < 0 keeps everything.
local function trim_finished(set, keep)
  if keep < 0 then
    return
  end
  local excess = redis.call('ZCARD', set) - keep
  if excess > 0 then
    local old = redis.call('ZPOPMIN', set, excess)
    for i = 1, #old, 2 do
      delete_job(old[i])
    end
  end
end

-- Record a finished job in its final set.
local function finish(jkey, id, set, state, now, keep)
  redis.call('HSET', jkey, 's', state, 'ft', now)
  redis.call('HDEL', jkey, 'tk')
  redis.call('ZADD', set, now, id)
  trim_finished(set, keep)
end

-- Create one job (WAITING or DELAYED). Returns id, created (0 when a job with that id exists:
-- it is left unchanged), and whether idle workers must be woken.
local function add_job(now, id, data, priority, delay, run_at, options, wait_was_empty)
  if id == '' then
    id = tostring(redis.call('HINCRBY', K_META, 'id', 1))
  elseif redis.call('EXISTS', job_key(id)) == 1 then
    return id, 0, false
  end
  local jkey = job_key(id)
  if run_at == 0 and delay > 0 then
    run_at = now + delay
  end
  redis.call('HSET', jkey, 'd', data, 'p', priority, 'et', now, 'a', 0)
  if options ~= '' then
    redis.call('HSET', jkey, 'o', options)
  end
  if run_at > now then
    redis.call('HSET', jkey, 's', 'delayed')
    redis.call('ZADD', K_DELAYED, run_at, id)
    emit('added', id, 's', 'delayed')
    -- Idle workers sleep until the earliest delayed job: tell them when that moves.
    local first = redis.call('ZRANGE', K_DELAYED, 0, 0)
    return id, 1, first[1] == id
  end
  enqueue_waiting(jkey, id)
  emit('added', id, 's', 'waiting')
  return id, 1, wait_was_empty
end
