-- lib/rate.lua: the sliding-window rate limit on starts, for the whole queue (ZSET "rl") or per
-- key in keyed mode (ZSET "rl:<key>", and the key waits in "k:limited" while it is used up).
-- Needs: layout.lua, waiting.lua (a key whose pause is over is refreshed into the ready set).
--!include layout.lua
--!include waiting.lua

-- How many more starts the window allows now, and when (ms from now) the next start is
-- allowed when none is. Entries older than the window are dropped.
local function rate_allowance(rkey, now)
  local m = meta()
  redis.call('ZREMRANGEBYSCORE', rkey, '-inf', now - m.rate_per)
  local room = m.rate_max - redis.call('ZCARD', rkey)
  if room > 0 then
    return room, -1
  end
  local oldest = redis.call('ZRANGE', rkey, 0, 0, 'WITHSCORES')
  return 0, math.max(1, tonumber(oldest[2]) + m.rate_per - now)
end

-- One start, counted in the window.
local function rate_record(rkey, now)
  redis.call('ZADD', rkey, now, redis.call('HINCRBY', K_META, 'rls', 1))
  redis.call('PEXPIRE', rkey, meta().rate_per + 1000)
end

-- Keys paused by their per-key rate limit whose pause is over become claimable again.
local function release_limited_keys(now)
  local due = redis.call('ZRANGEBYSCORE', K_LIMITED, '-inf', now, 'LIMIT', 0, PROMOTE_BATCH)
  for _, key in ipairs(due) do
    redis.call('ZREM', K_LIMITED, key)
    refresh_key(key)
  end
end
