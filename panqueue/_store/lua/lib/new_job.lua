-- lib/new_job.lua: creating a job (add, and a schedule's tick): the checks every new job
-- passes before anything is written, and add_job, which makes it WAITING, DELAYED or BLOCKED
-- (or FAILED at once, when a dependency will not complete), honouring custom ids and dedup keys.
-- Needs: layout.lua, waiting.lua, dependencies.lua, finish.lua, expiry.lua, identity.lua.
--!include layout.lua
--!include waiting.lua
--!include dependencies.lua
--!include finish.lua
--!include expiry.lua
--!include identity.lua

-- Times and durations an add may carry (ms): 2^52 ms is about 142,000 years. Any such value,
-- added to the server's clock, is still an exact integer in a double, Redis formats it without
-- an exponent, and PX / PEXPIRE accept it.
local MAX_TIME_MS = 4503599627370496

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
  elseif f.expires_in and not whole_in(f.expires_in, 0, MAX_TIME_MS) then
    return 'expires must be a whole number of ms between 0 and 2^52'
  elseif f.expires_at and not whole_in(f.expires_at, -MAX_TIME_MS, MAX_TIME_MS) then
    return 'expires_at must be a whole number of ms since the epoch, at most 2^52 either way'
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
    dkey = dedup_key(f.dedup)
    local existing = dedup_existing(dkey, f, now)
    if existing then
      return existing, 0
    end
  end
  local id = f.id
  if id == '' then
    local m = meta()
    id = tostring(redis.call('HINCRBY', K_META, 'id', 1) * m.partitions + m.partition)
  end
  local jkey = job_key(id)
  local run_at = f.run_at
  if run_at == 0 and f.delay > 0 then
    run_at = now + f.delay
  end
  -- A field at its default is not written (priority 0, no attempt yet): a waiting job's hash
  -- is most of the memory a queue of them takes.
  if f.priority ~= 0 then
    redis.call('HSET', jkey, 'd', f.data, 'et', now, 'p', f.priority)
  else
    redis.call('HSET', jkey, 'd', f.data, 'et', now)
  end
  if f.options ~= '' then
    redis.call('HSET', jkey, 'o', f.options)
  end
  if f.key ~= '' then
    redis.call('HSET', jkey, 'k', f.key)
  end
  if f.batch and f.batch ~= '' then
    redis.call('HSET', jkey, 'b', f.batch)  -- before any ending below: end_job reports it
  end
  if f.pointed then
    redis.call('HSET', jkey, 'ih', f.pointed)  -- its id's pointer (lib/identity.lua)
  end
  if dkey then
    redis.call('HSET', jkey, 'dd', f.dedup)
    redis.call('SET', dkey, id, 'PX', f.ttl)
  end
  -- A deadline to start by: absolute (expires_at), or ms from now on the server's clock.
  local deadline = nil
  if f.expires_at and f.expires_at ~= 0 then
    deadline = f.expires_at
  elseif f.expires_in and f.expires_in > 0 then
    deadline = now + f.expires_in
  end
  if deadline then
    redis.call('HSET', jkey, 'x', deadline)
    if deadline <= now then  -- already past: it never waits
      end_job(jkey, id, 'cancelled', now, cancelled_keep(), {reason = 'expired',
        event = {'added', 's', 'cancelled', 'fr', 'expired'}})
      return id, 1
    end
    redis.call('ZADD', K_EXPIRES, deadline, id)
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
    end_job(jkey, id, 'failed', now, -1, {error = err, reason = 'dependency_failed',
      event = {'added', 's', 'failed'}})
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
