-- lib/memo.lua: resend safety for the calls that claim jobs (claim, complete, fail); its key
-- (req_key) also holds the request ids of the signals sent (signal.lua).
-- Needs: layout.lua, status.lua, job_data.lua.
--
-- A reply can be lost after its script ran (the connection broke on the way back); the caller
-- then sends the same call again. Each of these calls carries a lock token that is fresh for
-- the call (unique per worker process and call), so the token doubles as a request id: the
-- script remembers what it did under "req:<token>" for one lock TTL, and a resent call answers
-- from that memory instead of acting twice. Without it a resent complete would answer "lock
-- lost" for the jobs it had completed, and the jobs the lost reply claimed would sit active
-- with nobody running them until the stalled sweep charged them a stall.
--
-- A call with an empty token (one that claims nothing) has no request id.
-- The memory holds the statuses the call answered and the ids it claimed. A replay rebuilds
-- the claimed part from the job hashes, keeping only the jobs still locked by that token (a
-- job the sweep has since taken away is not handed out again).
--!include layout.lua
--!include status.lua
--!include job_data.lua

-- Remember a call's reply: `reply` is {statuses..., count, wake_in, jobs...} where the
-- claim part starts at index `claim_at` (5 fields per job, the id first).
local function remember(token, reply, claim_at, ttl)
  local statuses, ids = {}, {}
  for i = 1, claim_at - 1 do
    statuses[i] = reply[i]
  end
  for i = claim_at + 2, #reply, 5 do
    ids[#ids + 1] = reply[i]
  end
  if token == '' or (#statuses == 0 and #ids == 0) then
    return  -- no request id, or an empty claim (it changed nothing: a resend is harmless)
  end
  redis.call('SET', req_key(token), cmsgpack.pack({statuses, ids}), 'PX', math.max(ttl, 1000))
end

-- The reply of an earlier call with this token, rebuilt; nil when there was none.
local function recall(token)
  if token == '' then
    return nil
  end
  local saved = redis.call('GET', req_key(token))
  if not saved then
    return nil
  end
  local memo = cmsgpack.unpack(saved)
  local reply = {}
  for _, status in ipairs(memo[1]) do
    reply[#reply + 1] = status
  end
  local count_at = #reply + 1
  reply[count_at] = 0
  reply[count_at + 1] = -1
  for _, id in ipairs(memo[2]) do
    local jkey = job_key(id)
    local f = redis.call('HMGET', jkey, 'tk', 'a', 'et', 'o', 'd', 'd1')
    if f[1] == token then
      reply[#reply + 1] = id
      reply[#reply + 1] = job_data(jkey, f[5], f[6])
      reply[#reply + 1] = tonumber(f[2])  -- a number: its record may have to be read
      reply[#reply + 1] = f[3]
      reply[#reply + 1] = f[4] or ''
      reply[count_at] = reply[count_at] + 1
    end
  end
  return reply
end

-- The opening of a call that ends one running attempt and may claim the slot's next job (fail,
-- snooze, rate_limited): a resent call answers what the first one did; an attempt whose lock
-- token no longer holds the job answers LOCK_LOST and changes nothing. Returns that answer, or
-- nil when the call goes on.
local function resent_or_lock_lost(request_token, id, lock_token)
  local replayed = recall(request_token)
  if replayed then
    return replayed
  end
  if redis.call('HGET', job_key(id), 'tk') ~= lock_token then
    return {LOCK_LOST}
  end
  return nil
end
