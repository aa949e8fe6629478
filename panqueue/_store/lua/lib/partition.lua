-- lib/partition.lua: which layout of a partitioned queue this partition belongs to, checked on
-- every add, worker setup and layout change (panqueue/_store/ops/layout.py).
-- Needs: settings.lua.
--!include settings.lua

-- How many jobs this partition holds, in any state: a layout change (relayout.lua) and a
-- partition joining a layout (partition_problem) need none.
local function stored_jobs()
  local held = tonumber(redis.call('HGET', K_META, 'kw') or '0')
    + redis.call('LLEN', K_WAIT_LIST)
  for _, set in ipairs({K_WAIT, K_DELAYED, K_BLOCKED, K_ACTIVE, K_COMPLETED, K_FAILED,
                        K_CANCELLED}) do
    held = held + redis.call('ZCARD', set)
  end
  return held
end

-- The layout a client routes by, as it declares this partition ("<count>:<index>:<version>",
-- '' for whatever is stored; panqueue/_keys.py QueueKeys.declared). A partition in no layout
-- yet, or left in an older one and holding no job, joins the declared layout (store_partition,
-- once the caller goes ahead); otherwise the declaration must be the stored one. A client that
-- learned another layout is refused with 'layout changed' and reads the layout again, so no
-- job is written where the queue's layout does not look. Returns nil, or the problem.
local function partition_problem(declared)
  local count, index, version = string.match(declared, '^(%d+):(%d+):(%d+)$')
  if not count then
    return nil
  end
  local m = meta()
  local stored = m.layout_version
  if not m.layout_stored or (m.partitions == tonumber(count) and m.partition == tonumber(index)
                             and stored == tonumber(version)) then
    return nil
  end
  if stored < tonumber(version) and stored_jobs() == 0 then
    return nil
  end
  return 'layout changed: this partition is ' .. m.partition .. ' of ' .. m.partitions
    .. ' in layout version ' .. stored .. ', the caller routes by partition ' .. index .. ' of '
    .. count .. ' in version ' .. version
end

local function store_partition(declared)
  local count, index, version = string.match(declared, '^(%d+):(%d+):(%d+)$')
  if not count then
    return
  end
  local m = meta()
  if not m.layout_stored or m.layout_version < tonumber(version) then
    redis.call('HSET', K_META, 'np', count, 'pi', index, 'lv', version)
    META = nil
  end
end
