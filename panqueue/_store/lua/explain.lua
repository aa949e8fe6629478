-- explain: why a waiting or delayed job has not started, answered by the claim's own rules. The
-- rules that hold the whole queue come from the function a claim checks (lib/claimable.lua
-- queue_closed); the job's turn is read from the structures a claim takes from (the wait set,
-- a key's list and the ready keys); a job past its deadline to start is one a claim ends
-- instead (lib/claim.lua activate). panqueue/_store/ops/explain.py turns the answer into words.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  job id
-- Returns  one of
--   {'state', s}                     the job is not waiting or delayed: s its state ('' none)
--   {'delayed', due}                 delayed until `due` (ms), still in the future
--   {'signal', name, due}            a durable job waits for the signal `name` (suspend.lua)
--                                    until its timeout `due` (ms; far in the future: none)
--   {'paused'}                       the queue is paused
--   {'paused_until', until}          a handler's RateLimited: no job starts until `until` (ms)
--   {'rate', free_at, limit, per, max}  the queue's rate window (`limit` starts per `per` ms:
--                                    the effective limit, at most `max`) is used up until
--                                    `free_at` (ms)
--   {'expired', x[, 'delayed']}      its deadline to start passed at `x` (ms): a claim or the
--                                    expiry sweep ends it CANCELLED "expired"; it never runs
--                                    ('delayed': it is not due, so only the sweep ends it)
--   {'key_limited', key, until}      its key's rate limit pauses the key until `until` (ms)
--   {'key_busy', key, running, ahead, kc}  its key runs kc jobs at a time and `running` run,
--                                    `ahead` wait before it
--   {'key_unready', key}             its key is not among the ready keys, though nothing holds it
--   {'key_rate_room', key, ahead, room, limit, per, max}  its key's rate window has room for
--                                    `room` starts and `ahead` jobs of the key come first
--   {'rate_room', ahead, room, limit, per, max}  the rate window has room for `room` starts
--                                    and `ahead` starts come first
--   {'ready', ahead, partitions, key, before}  a claim with ahead + 1 free slots takes it now
--                                    (keyed mode: ahead is its place in its key's list, key its
--                                    key; global mode: key ''); partitions: the queue's
--                                    partition count (a partitioned queue's global window is
--                                    outside this slot, rate_take.lua); before: the starts a
--                                    claim makes before this job's (keyed: the ready keys
--                                    before its key too)
-- Invariants: changes nothing that a claim at the same moment would not change first: due
--          delayed jobs move to waiting, keys whose rate-limit pause is over become ready, starts
--          that have left the rate window are dropped. It claims nothing and locks nothing.
--!include layout.lua
--!include waiting.lua
--!include wait_pages.lua
--!include rate.lua
--!include claimable.lua

local id = ARGV[1]
local jkey = job_key(id)
local now = now_ms()
local job = redis.call('HMGET', jkey, 's', 'x')
local state, x = job[1], tonumber(job[2])  -- x: its deadline to start by (nil: none)
if state ~= 'waiting' and state ~= 'delayed' then
  return {'state', state or ''}
end
if state == 'delayed' then
  local due = redis.call('ZSCORE', K_DELAYED, id)
  if x and x <= now then
    return {'expired', x, 'delayed'}  -- the expiry sweep ends it before it is due
  end
  if due and tonumber(due) > now then
    local waits = redis.call('HGET', durable_key(id), 'ws')
    if waits then
      return {'signal', waits, tonumber(due)}
    end
    return {'delayed', tonumber(due)}
  end
end
local closed, room = queue_closed(now)
if closed == 'paused' then
  return {'paused'}
end
if closed == 'paused_until' then
  return {'paused_until', now + room}
end
promote_due(now)  -- as the claim does, before it takes anything
if closed == 'rate' then
  return {'rate', now + room, effective_limit(K_RATE, now), meta().rate_per, meta().rate_max}
end
state = redis.call('HGET', jkey, 's')
if state ~= 'waiting' then
  return {'state', state or ''}
end
if x and x <= now then
  return {'expired', x}
end
local ahead, before, key
if keyed() then
  release_limited_keys(now)  -- as the claim does
  key = redis.call('HGET', jkey, 'k') or ''
  ahead = redis.call('LPOS', key_list(key), id) or 0
  local limited = redis.call('ZSCORE', K_LIMITED, key)
  if limited then
    return {'key_limited', key, tonumber(limited)}
  end
  local running = tonumber(redis.call('HGET', K_KEY_ACTIVE, key) or '0')
  if running + ahead >= meta().kc then
    return {'key_busy', key, running, ahead, meta().kc}
  end
  if meta().rate_max > 0 and meta().rate_per_key then
    -- The claim pauses the key once its window is used up: the jobs ahead of this one in the
    -- key take the starts the window has room for first.
    local rkey = K_RATE .. ':' .. key
    local key_room = rate_allowance(rkey, now)
    if ahead >= key_room then
      return {'key_rate_room', key, ahead, key_room, effective_limit(rkey, now),
              meta().rate_per, meta().rate_max}
    end
  end
  -- The claim pops the ready keys in turn: the keys before this one start a job first.
  local turn = redis.call('ZRANK', K_READY, key)
  if not turn then
    return {'key_unready', key}  -- the readiness invariant broken (lib/waiting.lua refresh_key)
  end
  before = turn + ahead
else
  ahead = wait_rank(id)
  before = ahead
end
if room and before >= room then
  return {'rate_room', before, room, effective_limit(K_RATE, now), meta().rate_per,
          meta().rate_max}
end
return {'ready', ahead, meta().partitions, key or '', before}
