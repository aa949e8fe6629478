-- purge: delete the jobs of some states, a bounded batch per call; with 'all', every job that is
-- not active and, once none is left, the queue's settings (kept while a job is active or a live
-- worker serves the queue). The caller repeats the call until it reports nothing left.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  most jobs deleted by this call   ARGV[2..] the states (waiting, delayed, blocked,
--          active, completed, failed, cancelled), or the single word 'all'
-- Returns  {deleted, more}: how many jobs this call deleted, and 1 when some are left to delete
--
-- Invariants: each job leaves its state's structure the way remove.lua takes it out (keyed
-- mode's per-key lists, the kw count and the ready set stay consistent: unwait/refresh_key); an
-- active job frees its key's slot (leave_active); delete_job removes the dependency edges on
-- both sides and fails the jobs still blocked on a deleted job (recorded in "failed", which a
-- purge of 'all' deletes next; one of the same page is deleted from there). States are visited
-- blocked first and finished last, so those cascades land where the same purge still looks.
--!include layout.lua
--!include settings.lua
--!include waiting.lua
--!include active.lua
--!include finish.lua

local budget = tonumber(ARGV[1])
local all = ARGV[2] == 'all'
local wanted = {}
if all then
  for _, state in ipairs({'blocked', 'delayed', 'waiting', 'completed', 'failed', 'cancelled'}) do
    wanted[state] = true
  end
else
  for i = 2, #ARGV do
    wanted[ARGV[i]] = true
  end
end
local now = now_ms()
local deleted = 0

local function delete(id)
  delete_job(id, now)
  deleted = deleted + 1
  budget = budget - 1
end

local SETS = {blocked = K_BLOCKED, delayed = K_DELAYED, completed = K_COMPLETED,
              failed = K_FAILED, cancelled = K_CANCELLED}

-- The ids of up to `budget` members of a sorted set, taken out of it.
local function take(set)
  if budget <= 0 then
    return {}
  end
  local ids = redis.call('ZRANGE', set, 0, budget - 1)
  if #ids > 0 then
    redis.call('ZREM', set, unpack(ids))
  end
  return ids
end

local function purge_waiting()
  if not keyed() then
    for _, id in ipairs(take(K_WAIT)) do
      delete(id)
    end
    if budget > 0 then
      local ids = redis.call('LRANGE', K_WAIT_LIST, 0, budget - 1)
      redis.call('LTRIM', K_WAIT_LIST, #ids, -1)
      for _, id in ipairs(ids) do
        delete(id)
      end
    end
    return
  end
  -- Every key with waiting jobs is ready, rate-limited or at its concurrency limit.
  local keys = {}
  for _, set in ipairs({K_READY, K_LIMITED}) do
    for _, key in ipairs(redis.call('ZRANGE', set, 0, -1)) do
      keys[#keys + 1] = key
    end
  end
  for _, key in ipairs(redis.call('HKEYS', K_KEY_ACTIVE)) do
    keys[#keys + 1] = key
  end
  for _, key in ipairs(keys) do
    if budget <= 0 then
      return
    end
    local ids = redis.call('LRANGE', key_list(key), 0, budget - 1)
    for _, id in ipairs(ids) do
      unwait(job_key(id), id)
      delete(id)
    end
  end
end

local function purge_active()
  for _, id in ipairs(redis.call('ZRANGE', K_ACTIVE, 0, budget - 1)) do
    leave_active(job_key(id), id)
    delete(id)
  end
end

for _, state in ipairs({'blocked', 'delayed', 'waiting', 'active', 'completed', 'failed',
                        'cancelled'}) do
  if wanted[state] and budget > 0 then
    if state == 'waiting' then
      purge_waiting()
    elseif state == 'active' then
      purge_active()
    else
      -- One at a time, each out of the set its hash names: deleting a job fails the jobs
      -- blocked on it, and a later one of this page may be such a job, now in "failed".
      for _, id in ipairs(redis.call('ZRANGE', SETS[state], 0, budget - 1)) do
        redis.call('ZREM', SETS[redis.call('HGET', job_key(id), 's')] or SETS[state], id)
        delete(id)
      end
    end
  end
end

local more = 0
if budget <= 0 then
  more = 1
elseif all then
  -- Nothing else is left but active jobs. The settings go unless a job still runs on them or
  -- a live worker serves the queue: a worker writes them only when it starts, so deleting them
  -- under it would silently drop its mode and rate limit.
  if redis.call('ZCARD', K_ACTIVE) == 0
      and redis.call('ZCOUNT', K_WORKERS, '(' .. now, '+inf') == 0 then
    -- The partition's place in a layout stays (np, pi, lv, pl): a producer that learned the
    -- layout before the purge must still be refused if it changes after (lib/layout.lua
    -- partition_problem). A one-partition queue whose layout never changed has none worth
    -- keeping: a producer that learned it is refused by any other count declared later.
    local layout = redis.call('HMGET', K_META, 'np', 'pi', 'lv', 'pl')
    redis.call('DEL', K_META, K_RATE, K_READY, K_LIMITED, K_KEY_ACTIVE, K_EXPIRES)
    if layout[1] and (layout[1] ~= '1' or (layout[3] or '0') ~= '0') then
      redis.call('HSET', K_META, 'np', layout[1], 'pi', layout[2] or '0', 'lv', layout[3] or '0')
      if layout[4] then
        redis.call('HSET', K_META, 'pl', layout[4])
      end
    end
  end
end
if deleted > 0 then
  emit('purged', '', 'n', deleted)
end
return {deleted, more}
