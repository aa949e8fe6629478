-- lib/claim.lua: WAITING -> ACTIVE. Taking up to n jobs for one worker's free slots, each
-- locked in the same step, honouring pause, the rate limit and keyed mode's round robin.
-- Needs: layout.lua, settings.lua, delayed.lua, rate.lua, activate.lua, claim_keyed.lua, claimable.lua, wait_order.lua.
-- (Due delayed jobs are promoted first; activate locks one job; claim_keyed is keyed mode's
-- round robin; claimable holds the rules that close the whole queue, shared with explain.lua.)
--!include layout.lua
--!include settings.lua
--!include delayed.lua
--!include rate.lua
--!include activate.lua
--!include claim_keyed.lua
--!include claimable.lua
--!include wait_order.lua

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

-- Claim up to n jobs for one worker (its free slots). Appends to `out`: count, wake_in (when
-- nothing was claimed: ms until something may be claimable, -1 unknown), then per job
-- id, data, attempt (a string for a job's first run, lib/activate.lua), enqueued_at, options.
-- Honours pause, a handler's RateLimited pause of the queue (pu), the rate limit and keyed
-- mode.
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
    count = claim_keyed(now, token, ttl, n, out, global_limit)
  else
    local want = n
    while want > 0 do
      local popped = pop_waiting(want)
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
  lock_activated()
  out[count_at] = count
  if count == 0 then
    -- Only an empty claim says when to look again (the busy path skips these reads): the next
    -- delayed job, or the first key whose per-key rate limit runs out.
    local next_in = wake_in(now)
    local first = redis.call('ZRANGE', K_LIMITED, '0', '0', 'WITHSCORES')
    if #first > 0 then
      next_in = earliest(next_in, math.max(1, tonumber(first[2]) - now))
    end
    out[count_at + 1] = next_in
  end
end
