-- lib/claimable.lua: whether a queue may start any job now. The rules a claim checks before it
-- takes a job (lib/claim.lua), written once: explain.lua names the one that holds a job by
-- calling this same function, so what a claim does and what explain says cannot part.
-- Needs: layout.lua, rate.lua.
--!include layout.lua
--!include rate.lua

-- Why the queue starts no job now, in the order a claim checks:
--   'paused'        the queue is paused (client.pause); a resume ends it
--   'paused_until'  a handler raised RateLimited (meta pu); second value: ms until it ends
--   'rate'          the queue's rate window is used up; second value: ms until a start leaves it
-- or nil and the starts the queue's rate window allows now (nil: the queue has no window of its
-- own; a per-key limit is the key's, lib/rate.lua release_limited_keys). Like the claim, it drops
-- the starts that have left the window.
local function queue_closed(now)
  local m = meta()
  if m.paused then
    return 'paused', -1
  end
  if m.paused_until and tonumber(m.paused_until) > now then
    return 'paused_until', tonumber(m.paused_until) - now
  end
  if m.rate_max > 0 and not m.rate_per_key then
    local room, retry_in = rate_allowance(K_RATE, now)
    if room == 0 then
      return 'rate', retry_in
    end
    return nil, room
  end
  return nil, nil
end
