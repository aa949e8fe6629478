-- lib/claim.lua: WAITING -> ACTIVE. Taking up to n jobs for one worker's free slots, each
-- locked in the same step, honouring pause, the rate limit and keyed mode's round robin.
-- Needs: layout.lua, waiting.lua, rate.lua, expiry.lua, claimable.lua. The wait order, promotion
-- and readiness (waiting); a job past its deadline to start is ended instead of claimed (expiry);
-- the rules that hold every job of the queue, shared with explain.lua (claimable).
--!include layout.lua
--!include waiting.lua
--!include rate.lua
--!include expiry.lua
--!include claimable.lua

-- The sooner of two waits in ms, where -1 means none.
local function earliest(a, b)
  if a < 0 then
    return b
  end
  if b < 0 then
    return a
  end
  return math.min(a, b)
end

-- WAITING -> ACTIVE with the lock token and a lock deadline, in one step (a sweeper can never
-- see a job that is claimed but not yet locked). `ws`: its place in the wait set (global mode),
-- kept with it for a requeue. Appends the job to `out` and returns true; or, when the job is
-- past its deadline to start (x), ends it CANCELLED "expired" and returns false.
local function activate(id, now, token, ttl, out, ws)
  local jkey = job_key(id)
  local f = redis.call('HMGET', jkey, 'd', 'et', 'o', 'a', 'x')
  if f[5] then
    if tonumber(f[5]) <= now then
      expire_job(jkey, id, now)
      return false
    end
    redis.call('ZREM', K_EXPIRES, id)  -- started in time: it cannot expire while it runs
  end
  local attempt = tonumber(f[4] or '0') + 1
  if ws then
    redis.call('HSET', jkey, 's', 'active', 'st', now, 'tk', token, 'a', attempt, 'ws', ws)
  else
    redis.call('HSET', jkey, 's', 'active', 'st', now, 'tk', token, 'a', attempt)
  end
  redis.call('ZADD', K_ACTIVE, now + ttl, id)
  out[#out + 1] = id
  out[#out + 1] = f[1]
  out[#out + 1] = attempt
  out[#out + 1] = f[2]
  out[#out + 1] = f[3] or ''
  emit('active', id, 'a', attempt)
  return true
end

-- Claim up to n jobs for one worker (its free slots). Appends to `out`: count, wake_in (when
-- nothing was claimed: ms until something may be claimable, -1 unknown), then per job
-- id, data, attempt, enqueued_at, options. Honours pause, a handler's RateLimited pause of the
-- queue (pu), the rate limit and keyed mode.
local function claim(now, token, ttl, n, out)
  local count_at = #out + 1
  out[count_at] = 0
  out[count_at + 1] = -1
  local m = meta()
  if n <= 0 then
    return
  end
  local closed, wait = queue_closed(now)
  if closed == 'paused' then
    return
  end
  if closed == 'paused_until' then
    out[count_at + 1] = wait  -- a handler's RateLimited: look then
    return
  end
  promote_due(now)
  if closed == 'rate' then
    out[count_at + 1] = earliest(wait, wake_in(now))
    return
  end
  local global_limit = wait ~= nil
  if global_limit then
    n = math.min(n, wait)  -- the starts the rate window has room for
  end
  local count = 0
  if keyed() then
    local key_limit = m.rate_max > 0 and m.rate_per_key
    release_limited_keys(now)
    local taken = 0  -- jobs taken out of the keys' lists (the kw count drops once, at the end)
    while count < n do
      local popped = redis.call('ZPOPMIN', K_READY)
      if #popped == 0 then
        break
      end
      local key = popped[1]
      local id = redis.call('LPOP', key_list(key))
      if id then
        taken = taken + 1
      end
      if id and not activate(id, now, token, ttl, out) then
        refresh_key(key, nil, true)  -- that job expired: the key's next one is up
      elseif id then
        local running = redis.call('HINCRBY', K_KEY_ACTIVE, key, 1)
        count = count + 1
        if global_limit then
          rate_record(K_RATE, now)
        end
        if key_limit then
          local rkey = K_RATE .. ':' .. key
          rate_record(rkey, now)
          local room, retry_in = rate_allowance(rkey, now)
          if room == 0 then
            redis.call('ZADD', K_LIMITED, now + retry_in, key)
          end
        end
        -- Back of the round robin with a new sequence number, if still eligible (a key now
        -- at capacity is not: it was popped and stays out until a job of it finishes).
        if running < m.kc then
          refresh_key(key, running, true)
        end
      else
        refresh_key(key, nil, true)
      end
    end
    if taken > 0 then
      redis.call('HINCRBY', K_META, 'kw', -taken)
    end
  else
    local want = n
    while want > 0 do
      local popped = redis.call('ZPOPMIN', K_WAIT, want)
      local expired = 0
      for i = 1, #popped, 2 do
        if activate(popped[i], now, token, ttl, out, popped[i + 1]) then
          count = count + 1
          if global_limit then
            rate_record(K_RATE, now)
          end
        else
          expired = expired + 1
        end
      end
      if expired == 0 then
        break
      end
      want = n - count  -- the places of the expired jobs go to the next ones
    end
  end
  out[count_at] = count
  if count == 0 then
    -- Only an empty claim says when to look again (the busy path skips these reads): the next
    -- delayed job, or the first key whose per-key rate limit runs out.
    local next_in = wake_in(now)
    local first = redis.call('ZRANGE', K_LIMITED, 0, 0, 'WITHSCORES')
    if #first > 0 then
      next_in = earliest(next_in, math.max(1, tonumber(first[2]) - now))
    end
    out[count_at + 1] = next_in
  end
end
