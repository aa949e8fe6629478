-- lib/active.lua: a running job stops running (finished, failed, stalled, released).
-- Needs: layout.lua, waiting.lua (keyed mode's readiness of the job's key).
--!include layout.lua
--!include waiting.lua

-- A running job stops running (finished, failed, stalled, released): its lock goes (with the
-- other job hash fields named in `...`, in the same command) and its key's slot is freed. It
-- leaves the active set too (leave_active); unlock leaves that to a caller that ends several
-- jobs and takes them all out of the set in one command.
local function unlock(jkey, ...)
  redis.call('HDEL', jkey, 'tk', ...)
  if keyed() then
    local key = redis.call('HGET', jkey, 'k')
    if key then
      local active = redis.call('HINCRBY', K_KEY_ACTIVE, key, '-1')
      if active < 0 then
        active = 0
        redis.call('HSET', K_KEY_ACTIVE, key, '0')
      end
      refresh_key(key, active)
    end
  end
end

local function leave_active(jkey, id, ...)
  redis.call('ZREM', K_ACTIVE, id)
  unlock(jkey, ...)
end
