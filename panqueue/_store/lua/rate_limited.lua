-- rate_limited: the handler reported that an outside service refuses for now (RateLimited):
-- ACTIVE -> WAITING at its old place, without using an attempt (the attempt count the claim
-- raised goes back down), and the job's key (keyed mode: "k:limited", as a per-key rate limit
-- does) or its whole queue (global mode: meta "pu", paused until) takes no new job until then.
-- A job whose cancellation was requested ends CANCELLED instead. Then claim the next jobs for
-- the slot (none of the paused key or queue). The steps are those of every ending of an
-- attempt (lib/ending.lua).
--
-- KEYS[1]  queue prefix
-- ARGV[1]  job id   ARGV[2] lock token   ARGV[3] retry after ms (0 .. 2^52)
-- ARGV[4]  history entry (msgpack)   ARGV[5] keep cancelled (-1 = all)   ARGV[6] claim n
-- ARGV[7]  new lock token (fresh for this call: also its request id, see lib/memo.lua)
-- ARGV[8]  lock ttl ms
-- Returns  {status, count, wake_in, jobs...}; status (lib/status.lua) RATE_LIMITED or
--          CANCELLED; or {LOCK_LOST} when the token does not match (nothing changed). A resent
--          call answers as the first one did and changes nothing.
-- An adaptive rate limit (RateLimit(adaptive=True)) is cut in the same call: the key's own
-- (per_key) or the queue's effective limit halves (lib/rate.lua limit_cut).
-- Invariants: a pause only ever grows (a shorter retry_after leaves a longer pause as it is);
--          the key is paused before its job goes back, so the requeue cannot make it ready;
--          a resent call cuts nothing (it answers from memory before any change).
--!include settings.lua
--!include rate.lua
--!include ending.lua

local early, at = open_ending({id = ARGV[1], token = ARGV[2], request = ARGV[7],
  keep = tonumber(ARGV[5]), claim_n = tonumber(ARGV[6]), ttl = tonumber(ARGV[8])})
if early then
  return early
end
local until_ms = at.now + tonumber(ARGV[3])
local job = redis.call('HMGET', at.jkey, 'k', 'x', 'st')
if meta().rate_max > 0 then
  local window = K_RATE
  if meta().rate_per_key then
    window = K_RATE .. ':' .. job[1]
  end
  limit_cut(window, at.now, tonumber(job[3] or at.now))
end
if keyed() then
  local paused = tonumber(redis.call('ZSCORE', K_LIMITED, job[1]) or '0')
  if paused < until_ms then
    redis.call('ZADD', K_LIMITED, until_ms, job[1])
  end
elseif tonumber(meta().paused_until or '0') < until_ms then
  redis.call('HSET', K_META, 'pu', until_ms)
  META = nil
end
leave_with_entry(at, ARGV[4])

local status
if cancel_heard(at) then
  status = CANCELLED
else
  status = RATE_LIMITED
  local attempts = give_back(at)
  rearm_expiry(at.id, job[2])
  requeue_waiting(at.jkey, at.id)  -- at its old place: it did not run
  emit('rate_limited', at.id, 'a', attempts, 'until', until_ms)
end
return ending_reply(at, status)
