-- retry: FAILED -> WAITING with a fresh set of attempts and snoozes (the history is kept), or
-- FAILED -> BLOCKED when a dependency of the job has not completed yet.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  limit when no ids are given   ARGV[2..] job ids (none: the oldest `limit` failed jobs)
-- Returns  how many jobs were moved back
-- Invariants: a job never starts before its dependencies have completed. A failed job moves
--          back only if every dependency it still needs (needs:<id>) may complete: it is
--          waiting, delayed, blocked or active, or it is moved back by this same call (in any
--          order). A job whose dependency stays failed, or was cancelled or deleted before it
--          completed (dx), stays FAILED, its error naming that dependency, and is not counted.
--!include layout.lua
--!include settings.lua
--!include waiting.lua
--!include dependencies.lua

local ids = {}
if #ARGV > 1 then
  for i = 2, #ARGV do
    ids[#ids + 1] = ARGV[i]
  end
else
  ids = redis.call('ZRANGE', K_FAILED, 0, tonumber(ARGV[1]) - 1)
end
local now = now_ms()
local before = claimable()

local candidates, is_candidate = {}, {}
for _, id in ipairs(ids) do
  if not is_candidate[id] and redis.call('ZSCORE', K_FAILED, id) then
    candidates[#candidates + 1] = id
    is_candidate[id] = true
  end
end

-- Which candidates stay failed, and why: those with a dependency that cannot complete now,
-- then, along the edges, every candidate that needs a candidate that stays.
local stays = {}
local needed_by = {}
local spread = {}
for _, id in ipairs(candidates) do
  local lost = redis.call('HGET', job_key(id), 'dx')
  if lost then
    stays[id] = 'dependency ' .. lost .. ' was cancelled or deleted before it completed'
  end
  for _, dep in ipairs(redis.call('SMEMBERS', needs_key(id))) do
    local state = redis.call('HGET', job_key(dep), 's')
    if is_candidate[dep] then
      needed_by[dep] = needed_by[dep] or {}
      table.insert(needed_by[dep], id)
    elseif state == 'completed' then
      redis.call('SREM', needs_key(id), dep)  -- not expected: completion removes the edge
      redis.call('SREM', deps_key(dep), id)
    elseif state == 'failed' or state == 'cancelled' or not state then
      stays[id] = stays[id] or ('dependency ' .. dep .. ' has not completed (it is '
        .. (state or 'deleted') .. ')')
    end
  end
  if stays[id] then
    spread[#spread + 1] = id
  end
end
local i = 1
while i <= #spread do
  for _, id in ipairs(needed_by[spread[i]] or {}) do
    if not stays[id] then
      stays[id] = 'dependency ' .. spread[i] .. ' has not completed (it is failed)'
      spread[#spread + 1] = id
    end
  end
  i = i + 1
end

local moved = 0
for _, id in ipairs(candidates) do
  local jkey = job_key(id)
  if stays[id] then
    redis.call('HSET', jkey, 'e', cmsgpack.pack({type = 'DependencyFailed',
      message = stays[id] .. '; not retried'}))
  else
    redis.call('ZREM', K_FAILED, id)
    redis.call('HSET', jkey, 'a', 0, 'sc', 0)
    -- sn: snoozes start over too; x: a job retried by hand no longer has a deadline to start by
    redis.call('HDEL', jkey, 'e', 'fr', 'ft', 'r', 'ra', 'sn', 'x')
    if redis.call('SCARD', needs_key(id)) > 0 then
      redis.call('HSET', jkey, 's', 'blocked')
      redis.call('ZADD', K_BLOCKED, now, id)
      emit('blocked', id, 'why', 'retried')
    else
      enqueue_waiting(jkey, id, nil, now)
      emit('waiting', id, 'why', 'retried')
    end
    moved = moved + 1
  end
end
wake_if_work_appeared(before)
return moved
