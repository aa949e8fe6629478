-- lib/wait_pages.lua: reading global mode's wait order without changing it: how many jobs
-- wait, a page of them, and how many go before one (setup.lua, select.lua, explain.lua; the
-- listing in Python, panqueue/_store/ops/jobs.py _wait_page, reads the same way).
-- Needs: layout.lua, wait_order.lua.
--!include layout.lua
--!include wait_order.lua

-- How many jobs wait (global mode), in both structures.
local function waiting_count()
  return redis.call('ZCARD', K_WAIT) + redis.call('LLEN', K_WAIT_LIST)
end

-- The ids of the waiting jobs from rank `first` to rank `last` (0-based, inclusive, last >= first)
-- of the wait order (global mode): O(log N + last - first), as a sorted set's range is.
local function wait_range(first, last)
  local before = redis.call('ZCOUNT', K_WAIT, '-inf', WAIT_LIST_PLACE)
  local listed = redis.call('LLEN', K_WAIT_LIST)
  local ids = {}
  local function take(found)
    for _, id in ipairs(found) do
      ids[#ids + 1] = id
    end
  end
  if first < before then
    take(redis.call('ZRANGE', K_WAIT, first, math.min(last, before - 1)))
  end
  if last >= before and first < before + listed then
    take(redis.call('LRANGE', K_WAIT_LIST, math.max(first - before, 0),
      math.min(last - before, listed - 1)))
  end
  if last >= before + listed then
    take(redis.call('ZRANGE', K_WAIT, math.max(first, before + listed) - listed, last - listed))
  end
  return ids
end

-- How many waiting jobs go before job `id` (global mode; 0 when it is not waiting).
local function wait_rank(id)
  local rank = redis.call('ZRANK', K_WAIT, id)
  if rank then
    if rank < redis.call('ZCOUNT', K_WAIT, '-inf', WAIT_LIST_PLACE) then
      return rank
    end
    return rank + redis.call('LLEN', K_WAIT_LIST)
  end
  local at = redis.call('LPOS', K_WAIT_LIST, id)
  if not at then
    return 0
  end
  return at + redis.call('ZCOUNT', K_WAIT, '-inf', WAIT_LIST_PLACE)
end
