-- lib/delayed.lua: DELAYED -> WAITING once due (every claim, and promote.lua), and when the
-- next delayed job is due (an idle worker sleeps until then).
-- Needs: layout.lua, settings.lua (emit), waiting.lua.
--!include layout.lua
--!include settings.lua
--!include waiting.lua

-- Due jobs moved per call at most: text, as redis.call takes it (a Lua number would be written
-- out with "%.17g" on every call).
local PROMOTE_BATCH = '1000'

-- Move due delayed jobs into waiting. Returns how many moved.
local function promote_due(now)
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', int_arg(now), 'LIMIT', '0',
    PROMOTE_BATCH)
  if #due == 0 then
    return 0
  end
  redis.call('ZREM', K_DELAYED, unpack(due))
  for _, id in ipairs(due) do
    enqueue_waiting(job_key(id), id, nil, now)
    emit('waiting', id)
  end
  return #due
end

-- Milliseconds until the next delayed job is due, or -1 if there is none.
local function wake_in(now)
  local first = redis.call('ZRANGE', K_DELAYED, '0', '0', 'WITHSCORES')
  if #first == 0 then
    return -1
  end
  return math.max(0, tonumber(first[2]) - now)
end
