-- rate_limited: the handler reported that an outside service refuses for now (RateLimited):
-- ACTIVE -> WAITING at its old place, without using an attempt (the attempt count the claim
-- raised goes back down), and the job's key (keyed mode: "k:limited", as a per-key rate limit
-- does) or its whole queue (global mode: meta "pu", paused until) takes no new job until then.
-- A job whose cancellation was requested ends CANCELLED instead. Then claim the next jobs for
-- the slot (none of the paused key or queue).
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
--!include layout.lua
--!include status.lua
--!include waiting.lua
--!include rate.lua
--!include claim.lua
--!include finish.lua
--!include expiry.lua
--!include memo.lua

local early = resent_or_lock_lost(ARGV[7], ARGV[1], ARGV[2])
if early then
  return early
end
local id = ARGV[1]
local jkey = job_key(id)
local now = now_ms()
local until_ms = now + tonumber(ARGV[3])
local before = claimable()
local job = redis.call('HMGET', jkey, 'k', 'x', 'st')
if meta().rate_max > 0 then
  local window = K_RATE
  if meta().rate_per_key then
    window = K_RATE .. ':' .. job[1]
  end
  limit_cut(window, now, tonumber(job[3] or now))
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
leave_active(jkey, id)
redis.call('HSET', jkey, 'h', (redis.call('HGET', jkey, 'h') or '') .. ARGV[4])

local status
if redis.call('HEXISTS', jkey, 'cx') == 1 then
  status = CANCELLED
  end_job(jkey, id, 'cancelled', now, tonumber(ARGV[5]))
else
  status = RATE_LIMITED
  local attempts = redis.call('HINCRBY', jkey, 'a', -1)
  rearm_expiry(id, job[2])
  requeue_waiting(jkey, id)
  emit('rate_limited', id, 'a', attempts, 'until', until_ms)
end
local reply = {status}
claim(now, ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[6]), reply)
wake_if_work_appeared(before)
remember(ARGV[7], reply, 2, tonumber(ARGV[8]))
return reply
