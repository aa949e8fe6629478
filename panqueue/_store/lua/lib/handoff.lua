-- lib/handoff.lua: an added job handed straight to an idle worker, so that picking it up costs
-- the worker no claim of its own (one trip through Redis instead of a wake-up and then a claim).
-- Needs: layout.lua, claim.lua, memo.lua, cancel_request.lua.
--
-- A worker whose claim found nothing registers that claim's token in the ZSET "idle", as
-- "<lock ttl ms>:<token>", scored by when the registration expires (the worker claims again
-- by then). An add that leaves claimable work takes the freshest live registration, claims one
-- job for it with the registered token (lib/claim.lua: pause, rate limits, keyed mode and the
-- wait order all hold, as in any claim), remembers the claim under that token (lib/memo.lua)
-- and publishes it on the notify channel: "h" .. msgpack {token, claim reply}.
--
-- The published message is a fast path only; the memory makes it safe. A worker's next claim
-- withdraws its registration (withdraw_idle) and, in the same step, takes over any job that was
-- handed to it meanwhile: a message that was lost, or that arrived after the worker moved on,
-- costs a delay, never a job. A worker that stops withdraws its registration the same way and
-- releases what it was handed. A registration outlives its worker only until it expires; a job
-- handed to a worker that died in that window is recovered by the stalled sweep, like a job
-- its worker claimed just before dying.
--!include layout.lua
--!include claim.lua
--!include memo.lua
--!include cancel_request.lua

local function idle_member(ttl, token)
  return ttl .. ':' .. token
end

-- Register `token` (a claim that found nothing) until now + wait_ms.
local function register_idle(token, ttl, now, wait_ms)
  redis.call('ZADD', K_IDLE, now + wait_ms, idle_member(ttl, token))
end

-- Withdraw the registration of `prev` and take over the jobs handed to it, still locked by it:
-- they are locked with `token` from now on. Appends their claim records (5 fields each) to
-- `taken`. A job cancelled meanwhile has its request told again, for its new lock.
local function withdraw_idle(prev, token, ttl, taken)
  redis.call('ZREM', K_IDLE, idle_member(ttl, prev))
  local handed = recall(prev)
  if not handed then
    return
  end
  redis.call('DEL', req_key(prev))
  for i = 3, #handed, 5 do
    local jkey = job_key(handed[i])
    redis.call('HSET', jkey, 'tk', token)
    if redis.call('HEXISTS', jkey, 'cx') == 1 then
      tell_cancel(handed[i], token)
    end
    for j = i, i + 4 do
      taken[#taken + 1] = handed[j]
    end
  end
end

-- Hand claimable jobs to idle workers, one job per live registration. Returns how many
-- claimable units there are after it (lib/wake.lua claimable), or nil when it did not count
-- them (no registration, or a claim that took nothing).
local function hand_off(now)
  if redis.call('EXISTS', K_IDLE) == 0 then
    return nil
  end
  local count = claimable()
  while count > 0 do
    local top = redis.call('ZPOPMAX', K_IDLE)
    if #top == 0 then
      return count
    end
    if tonumber(top[2]) <= now then
      -- Scored by when they expire: the last to expire has, so has every other.
      redis.call('DEL', K_IDLE)
      return count
    end
    local ttl, token = string.match(top[1], '^(%d+):(.*)$')
    ttl = tonumber(ttl)
    local out = {}
    claim(now, token, ttl, 1, out)
    if out[1] == 0 then
      -- Nothing claimable for anyone (paused, rate limited): the registration stands.
      redis.call('ZADD', K_IDLE, top[2], top[1])
      return nil
    end
    remember(token, out, 1, ttl)
    redis.call('SPUBLISH', K_NOTIFY, 'h' .. cmsgpack.pack({token, out}))
    count = claimable()
  end
  return count
end
