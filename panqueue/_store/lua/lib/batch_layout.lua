-- lib/batch_layout.lua: the keys of one batch, its answer to the caller, its lifetime, and
-- the step that fires it. Every batch script starts from here.
-- Needs: nothing.
--
-- KEYS[1] is the batch prefix "{b:<id>}:": a batch's jobs may live in several queues, so its
-- state has a hash slot of its own (panqueue/_keys.py BatchKeys names the same keys). A job's
-- ending happens in its queue's slot; it reaches the batch through the queue's batch outbox
-- (lib/finish.lua) and batch_record.lua.
--
-- HASH "state": oc on_complete callback, os on_success callback ('' none) (msgpack
--   [queue, data]), pa parent batch id ('' none), closed '1' once closed, c completed,
--   f failed (failed, cancelled, expired, or deleted before it ended), fired '1' once the batch
--   is closed and every job ended (set once: from then on its callbacks are due), added '1'
--   once they were added.
-- SET "jobs": "<queue>\t<job id>" of every job registered (before its add, so the batch never
--   looks finished early); SET "ended": the registered jobs whose ending was recorded.
-- SET "queues": the outboxes that hold the jobs' endings, one per queue partition the jobs were
--   added to: "<queue>\t<that partition's batch_outbox key>" ("<queue>" alone, in a batch
--   registered before outboxes were named: the queue's first partition).
-- Lifetime: every change keeps the batch for OPEN_TTL_MS more; once its callbacks are added,
-- it is kept DONE_TTL_MS (for info()) and then expires.

local B = KEYS[1]
local K_STATE = B .. 'state'
local K_JOBS = B .. 'jobs'
local K_ENDED = B .. 'ended'
local K_QUEUES = B .. 'queues'
local OPEN_TTL_MS = 604800000  -- 7 days
local DONE_TTL_MS = 86400000  -- 1 day

local function keep_for(ttl)
  for _, key in ipairs({K_STATE, K_JOBS, K_ENDED, K_QUEUES}) do
    redis.call('PEXPIRE', key, ttl)
  end
end

-- The batch as every batch script answers: {status, total, completed, failed, closed,
-- on_complete, on_success, parent}. status: 'open' (nothing to do), 'fire' (its callbacks
-- are due and not yet added), 'done' (they were added), 'gone' (no such batch).
local function answer(status)
  local s = redis.call('HMGET', K_STATE, 'c', 'f', 'closed', 'oc', 'os', 'pa')
  return {status, redis.call('SCARD', K_JOBS), tonumber(s[1] or '0'), tonumber(s[2] or '0'),
          s[3] or '0', s[4] or '', s[5] or '', s[6] or ''}
end

-- Fire the batch when it is closed and every registered job has ended ("ended" only holds
-- registered jobs, so equal sizes mean none is pending); answer what the caller must do. A
-- batch fires once: after that it answers 'fire' until batch_added.lua marks the callbacks
-- added, so whoever finds them due adds them; each callback queue adds them only while it owes
-- them (batch_callback.lua), so a second firer adds nothing.
local function settle()
  local s = redis.call('HMGET', K_STATE, 'closed', 'fired', 'added')
  if s[3] == '1' then
    return answer('done')
  end
  keep_for(OPEN_TTL_MS)
  if s[2] == '1' then
    return answer('fire')
  end
  if s[1] == '1' and redis.call('SCARD', K_ENDED) >= redis.call('SCARD', K_JOBS) then
    redis.call('HSET', K_STATE, 'fired', '1')
    return answer('fire')
  end
  return answer('open')
end

-- A refusal when the batch does not exist, else nil.
local function missing()
  if redis.call('EXISTS', K_STATE) == 0 then
    return {'!', 'no such batch (it was never opened, or it expired: 7 days after its ' ..
      'last change while open, a day after its callbacks were added)'}
  end
  return nil
end

-- "<queue>\t<job id>": how the batch names a job (job ids are unique only within a queue).
local function member(queue, id)
  return queue .. '\t' .. id
end
