-- lib/rate.lua: the sliding-window rate limit on starts, for the whole queue (ZSET "rl") or per
-- key in keyed mode (ZSET "rl:<key>", and the key waits in "k:limited" while it is used up).
-- Needs: layout.lua, waiting.lua, delayed.lua. (A key whose pause is over is refreshed into the
-- ready set; delayed.lua's batch size, PROMOTE_BATCH, bounds the keys released per call too.)
--
-- Adaptive limits (meta "rla" = the recovery step in ms; absent: the limit is fixed at "rlm"):
-- the limit in force, the effective limit, is stored only while it is below the maximum, as
-- "<limit>:<ms of its last cut>" in meta field "rle" (the queue's limit) or in STRING
-- "rle:<key>" (a key's; it expires when the limit is back at the maximum). Its value now is
-- computed from the server clock, min(max, limit + floor((now - cut) / step)), so recovery needs
-- no background process. rate_limited.lua cuts it (limit_cut).
--!include layout.lua
--!include waiting.lua
--!include delayed.lua

-- The recovery step of an adaptive limit in ms, or 0 for a fixed limit (read once per script).
local RATE_STEP = nil
local function rate_step()
  if not RATE_STEP then
    RATE_STEP = tonumber(redis.call('HGET', K_META, 'rla') or '0')
  end
  return RATE_STEP
end

-- Where the effective limit of a window (K_RATE or K_RATE .. ':' .. key) is kept: nil for the
-- queue's (a meta field), else the key's STRING "rle:<key>", named after its window as the
-- window is after K_RATE. "rle:" cannot collide with any "rl:<key>".
local function limit_key(rkey)
  if rkey == K_RATE then
    return nil
  end
  return K_RATE .. 'e' .. string.sub(rkey, #K_RATE + 1)
end

-- The effective limit of a window now, and the time (ms) of its last cut (nil: none in force).
local function effective_limit(rkey, now)
  local max = meta().rate_max
  local step = rate_step()
  if step <= 0 then
    return max, nil
  end
  local lkey = limit_key(rkey)
  local saved
  if lkey then
    saved = redis.call('GET', lkey)
  else
    saved = redis.call('HGET', K_META, 'rle')
  end
  if not saved then
    return max, nil
  end
  local sep = string.find(saved, ':', 1, true)
  local limit, cut = tonumber(string.sub(saved, 1, sep - 1)), tonumber(string.sub(saved, sep + 1))
  return math.min(max, limit + math.floor((now - cut) / step)), cut
end

-- A handler's RateLimited on an adaptive limit: halve the effective limit (not below 1) and
-- restart its recovery. A job that did not start after the last cut ran at the rate that cut
-- already answered: its refusal cuts nothing more, so a burst of refusals from jobs that were in
-- flight together counts once (as one lost window does in TCP), instead of collapsing the limit
-- to 1.
local function limit_cut(rkey, now, started)
  local step = rate_step()
  if step <= 0 then
    return
  end
  local limit, cut = effective_limit(rkey, now)
  if cut and started <= cut then
    return
  end
  local halved = math.max(1, math.floor(limit / 2))
  local saved = halved .. ':' .. now
  local lkey = limit_key(rkey)
  if lkey then
    -- Gone once the limit has climbed back to the maximum: a key's state lasts no longer.
    redis.call('SET', lkey, saved, 'PX', (meta().rate_max - halved) * step + 1000)
  else
    redis.call('HSET', K_META, 'rle', saved)
  end
end

-- How many more starts the window allows now, and when (ms from now) the next start is
-- allowed when none is. Entries older than the window are dropped. Under an adaptive limit cut
-- below the starts already in the window, the next start waits until enough of them leave.
local function rate_allowance(rkey, now)
  local m = meta()
  redis.call('ZREMRANGEBYSCORE', rkey, '-inf', now - m.rate_per)
  local used = redis.call('ZCARD', rkey)
  local limit = effective_limit(rkey, now)
  if used < limit then
    return limit - used, -1
  end
  local leaving = redis.call('ZRANGE', rkey, used - limit, used - limit, 'WITHSCORES')
  return 0, math.max(1, tonumber(leaving[2]) + m.rate_per - now)
end

-- One start, counted in the window.
local function rate_record(rkey, now)
  redis.call('ZADD', rkey, int_arg(now), redis.call('HINCRBY', K_META, 'rls', '1'))
  redis.call('PEXPIRE', rkey, meta().rate_per + 1000)
end

-- Keys paused by their per-key rate limit (or a handler's RateLimited) whose pause is over
-- become claimable again, unless their window is still used up (an adaptive cut can leave more
-- starts in it than the new limit allows): those wait on until it has room.
local function release_limited_keys(now)
  local m = meta()
  local due = redis.call('ZRANGEBYSCORE', K_LIMITED, '-inf', int_arg(now), 'LIMIT', '0',
    PROMOTE_BATCH)
  for _, key in ipairs(due) do
    local room, retry_in = 1, -1
    if m.rate_max > 0 and m.rate_per_key then
      room, retry_in = rate_allowance(K_RATE .. ':' .. key, now)
    end
    if room > 0 then
      redis.call('ZREM', K_LIMITED, key)
      refresh_key(key)
    else
      redis.call('ZADD', K_LIMITED, now + retry_in, key)
    end
  end
end
