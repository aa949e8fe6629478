-- lib/waiting.lua: where a job waits before it runs and how it gets there: putting a job into
-- waiting (at the back or at its old place) and taking it out, the readiness of keyed mode's
-- keys and the slot a running job holds in its key. The wait order is lib/wait_order.lua's,
-- promotion of due delayed jobs lib/delayed.lua's.
-- Needs: layout.lua, settings.lua, wait_order.lua, wake.lua (a change of waiting may wake
-- idle workers: every script that includes this one may call wake_if_work_appeared).
--
-- Waiting jobs: global mode, LIST "wl" and ZSET "wait" (lib/wait_order.lua); keyed mode:
-- LIST "k:wait:<key>" per key, HASH "k:active" key -> running count, ZSET "k:ready" of keys
-- that have waiting jobs and free capacity (score = seq: round robin), ZSET "k:limited" of keys
-- paused by their per-key rate limit (score = when they may start again).
-- Delayed jobs: ZSET "delayed" (score = when due); blocked jobs: ZSET "blocked" (they wait for
-- dependencies, lib/dependencies.lua).
--!include layout.lua
--!include settings.lua
--!include wait_order.lua
--!include wake.lua

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
      redis.call('ZADD', K_READY, redis.call('HINCRBY', K_META, 'seq', '1'), key)
    end
  elseif not popped then
    redis.call('ZREM', K_READY, key)
  end
  if waiting == 0 and active <= 0 then
    redis.call('HDEL', K_KEY_ACTIVE, key)
  end
end

-- Put a job into waiting, behind the others (of its priority / of its key). `new`: the fields of
-- a job add_job (lib/new_job.lua) wrote with its state just now: they are not read back.
local function enqueue_waiting(jkey, id, new, now)
  if new then
    -- a new job: its fields are written with its add
  elseif now then  -- ready again since `now` (rt): how long it has waited counts from there
    redis.call('HSET', jkey, 's', 'waiting', 'rt', int_arg(now))
  else
    redis.call('HSET', jkey, 's', 'waiting')
  end
  if keyed() then
    local key = new and new.key ~= '' and new.key or redis.call('HGET', jkey, 'k')
    redis.call('RPUSH', key_list(key), id)
    redis.call('HINCRBY', K_META, 'kw', '1')
    refresh_key(key)
    return
  end
  local priority = new and new.priority or tonumber(redis.call('HGET', jkey, 'p') or '0') or 0
  if waits_in_list(priority) then
    redis.call('RPUSH', K_WAIT_LIST, id)
    return
  end
  -- The place is kept in the set alone; a claim copies it to the job ("ws", requeue_waiting).
  redis.call('ZADD', K_WAIT, wait_score(priority, next_wait_seq()), id)
end

-- Put a job back at the front (a stalled or released job goes before later arrivals): of its
-- list (keyed mode, the default priority), else at the place it had in the set (its "ws").
local function requeue_waiting(jkey, id)
  if keyed() then
    redis.call('HSET', jkey, 's', 'waiting')
    local key = redis.call('HGET', jkey, 'k')
    redis.call('LPUSH', key_list(key), id)
    redis.call('HINCRBY', K_META, 'kw', '1')
    refresh_key(key)
    return
  end
  local f = redis.call('HMGET', jkey, 'p', 'ws')
  if not f[2] and not waits_in_list(tonumber(f[1] or '0') or 0) then
    return enqueue_waiting(jkey, id)
  end
  redis.call('HSET', jkey, 's', 'waiting')
  if waits_in_list(tonumber(f[1] or '0') or 0) then
    redis.call('LPUSH', K_WAIT_LIST, id)
  else
    redis.call('ZADD', K_WAIT, f[2], id)
  end
end

-- Take a job out of waiting (cancel, remove, dedup replace).
local function unwait(jkey, id)
  if keyed() then
    local key = redis.call('HGET', jkey, 'k')
    if redis.call('LREM', key_list(key), '1', id) > 0 then
      redis.call('HINCRBY', K_META, 'kw', '-1')
    end
    refresh_key(key)
    return
  end
  -- Default priority may be in the set too (written before the list): ZREM, O(log N), first.
  if redis.call('ZREM', K_WAIT, id) == 0 then
    unlist(jkey, id)
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
