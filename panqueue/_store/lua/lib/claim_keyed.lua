-- lib/claim_keyed.lua: keyed mode's part of the claim: the ready keys in round robin, one job
-- of each per turn, each key's running count and per-key rate limit kept as it goes.
-- Needs: layout.lua, settings.lua, waiting.lua (readiness), rate.lua, activate.lua.
--!include layout.lua
--!include settings.lua
--!include waiting.lua
--!include rate.lua
--!include activate.lua

-- Claim up to n jobs from the ready keys, appending them to `out` (as activate does). Records
-- each start in the queue's window too when `global_limit`. Returns how many were claimed.
local function claim_keyed(now, token, ttl, n, out, global_limit)
  local m = meta()
  local count = 0
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
      local running = redis.call('HINCRBY', K_KEY_ACTIVE, key, '1')
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
  return count
end
