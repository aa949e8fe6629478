-- lib/new_job.lua: creating a job (add, and a schedule's tick): add_job, which makes it
-- WAITING, DELAYED or BLOCKED (or FAILED at once, when a dependency will not complete),
-- honouring custom ids and dedup keys (the checks an add makes first: lib/new_job_checks.lua).
-- Needs: layout.lua, settings.lua (emit), waiting.lua, wake.lua, dependencies.lua, flow_record.lua, finish.lua, expiry.lua, identity.lua, new_ids.lua, job_data.lua.
--!include layout.lua
--!include settings.lua
--!include waiting.lua
--!include wake.lua
--!include dependencies.lua
--!include flow_record.lua
--!include finish.lua
--!include expiry.lua
--!include identity.lua
--!include new_ids.lua
--!include job_data.lua

-- Create one job: WAITING, DELAYED or BLOCKED (or FAILED at once when a dependency already
-- failed, was cancelled or no longer exists). `f` holds the fields the add script validated.
-- Returns id, created (0 when a job with that id, or a live duplicate under its dedup key,
-- exists: it is returned unchanged).
local function add_job(now, f)
  if f.id ~= '' and redis.call('EXISTS', job_key(f.id)) == 1 then
    return f.id, 0  -- idempotent custom id: checked first, so a dedup replace cannot lose it
  end
  local dkey = nil
  if f.dedup ~= '' and f.strategy ~= 'held' then  -- held: decided in its home, no record here
    dkey = dedup_key(f.dedup)
    local existing = dedup_existing(dkey, f, now)
    if existing then
      return existing, 0
    end
  end
  local id = f.id
  if id == '' then
    id = generated_id()
  end
  local jkey = job_key(id)
  local run_at = f.run_at
  if run_at == 0 and f.delay > 0 then
    run_at = now + f.delay
  end
  -- A job with no dependency and no deadline, due now, waits: its state goes with its fields.
  local deadline = start_deadline(now, f.expires_in, f.expires_at)
  local waits = #f.deps == 0 and not deadline and run_at <= now
  -- Its fields in one write, before any ending below (end_job reports b).
  write_new_job(jkey, now, f, flow_named(f.deps), f.dedup ~= '' and f.dedup or nil, deadline,
    waits)
  if f.tags and f.tags ~= '' then
    -- Scored by the partition's count of tagged adds: a tag's index is in the order of adds.
    local order = redis.call('HINCRBY', K_META, 'tgn', '1')
    for tag in string.gmatch(f.tags, '[^\n]+') do
      redis.call('ZADD', tag_key(tag), order, id)
    end
  end
  if dkey then
    redis.call('SET', dkey, id, 'PX', f.ttl)
  end
  local depends = #f.deps > 0  -- (most jobs depend on none: the calls below are skipped)
  if depends then
    record_flow(id, f.deps)  -- before any ending below: the flow shows it whatever it is
  end
  if deadline then
    if deadline <= now then  -- already past: it never waits
      end_job(jkey, id, 'cancelled', now, cancelled_keep(), {reason = 'expired',
        event = {'added', 's', 'cancelled', 'fr', 'expired'}})
      return id, 1
    end
    redis.call('ZADD', K_EXPIRES, deadline, id)
  end
  local waiting, failed_dep, lost_dep, lost_state = false, nil, nil, nil
  if depends then
    waiting, failed_dep, lost_dep, lost_state = link_needs(id, f.deps)
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
    end_job(jkey, id, 'failed', now, cancelled_keep(), {error = err, reason = 'dependency_failed',
      event = {'added', 's', 'failed'}})
  elseif waiting then
    redis.call('HSET', jkey, 's', 'blocked')
    if run_at > now then
      redis.call('HSET', jkey, 'ra', run_at)  -- released into DELAYED if still in the future
    end
    redis.call('ZADD', K_BLOCKED, int_arg(now), id)
    emit('added', id, 's', 'blocked')
  elseif run_at > now then
    redis.call('HSET', jkey, 's', 'delayed')
    redis.call('ZADD', K_DELAYED, run_at, id)
    emit('added', id, 's', 'delayed')
    -- Idle workers sleep until the earliest delayed job: tell them when that moves.
    local first = redis.call('ZRANGE', K_DELAYED, '0', '0')
    if first[1] == id then
      wake_workers()
    end
  else
    enqueue_waiting(jkey, id, waits and f)
    emit('added', id, 's', 'waiting')
  end
  return id, 1
end
