-- setup: a worker declares how it runs the queue, before it claims anything.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  mode (global | keyed)   ARGV[2] key concurrency   ARGV[3] rate max (0 = no limit)
-- ARGV[4]  rate window ms   ARGV[5] rate limit per key (1/0)   ARGV[6] schema version
-- ARGV[7]  how many failed/cancelled jobs the queue keeps (used when a producer cancels a job)
-- ARGV[8]  how many history records the queue keeps (0: none; absent: left as stored)
-- ARGV[9]  adaptive rate limit: its recovery step ms (0 or absent: the limit is fixed)
-- ARGV[10] this partition, "<count>:<index>:<version>" (absent: as stored; lib/layout.lua
--          partition_problem: a partition in no layout yet joins the declared one)
-- ARGV[11] how many events the queue's event stream keeps (0: only those of a job's end,
--          lib/settings.lua emit; absent: left as stored)
-- ARGV[12] '1': the queue writes every event even while nobody reads them (lib/settings.lua
--          watched; absent: left as stored)
-- Returns  {'ok'} or {'!', message} when the queue's stored mode differs, or its layout (a
--          change of the layout is relayout.lua's, done before; nothing changed).
-- Invariants: a stored mode never changes (a keyed queue holds only keyed jobs, a global one only
--          unkeyed ones); a partition joins only a layout it may (partition_problem,
--          lib/partition.lua); after a change of the settings every key's readiness holds again
--          (refresh_key, lib/waiting.lua) and idle workers are woken when keys became ready.
--!include layout.lua
--!include settings.lua
--!include partition.lua
--!include waiting.lua
--!include wait_pages.lua

local stored = redis.call('HGET', K_META, 'mode')
if stored and stored ~= ARGV[1] then
  return {'!', 'queue mode mismatch: the queue is ' .. stored .. ', this worker runs it as '
    .. ARGV[1]}
end
if not stored and ARGV[1] == 'keyed' and waiting_count() > 0 then
  return {'!', 'queue has unkeyed waiting jobs; it cannot become keyed'}
end
local problem = partition_problem(ARGV[10] or '')
if problem then
  return {'!', problem}
end
store_partition(ARGV[10] or '')
redis.call('HSETNX', K_META, 'v', ARGV[6])
redis.call('HSET', K_META, 'mode', ARGV[1], 'kc', ARGV[2], 'kf', ARGV[7])
if ARGV[8] then
  redis.call('HSET', K_META, 'kh', ARGV[8])
end
if ARGV[11] then
  redis.call('HSET', K_META, 'ke', ARGV[11])
end
if ARGV[12] == '1' then
  redis.call('HSET', K_META, 'ka', '1')
elseif ARGV[12] then
  redis.call('HDEL', K_META, 'ka')
end
if tonumber(ARGV[3]) > 0 then
  redis.call('HSET', K_META, 'rlm', ARGV[3], 'rlp', ARGV[4], 'rlk', ARGV[5])
else
  redis.call('HDEL', K_META, 'rlm', 'rlp', 'rlk')
end
-- An adaptive limit keeps its cuts (lib/rate.lua) across worker restarts; a fixed one has none.
if tonumber(ARGV[3]) > 0 and tonumber(ARGV[9] or '0') > 0 then
  redis.call('HSET', K_META, 'rla', ARGV[9])
else
  redis.call('HDEL', K_META, 'rla', 'rle')
end
META = nil
-- A changed key concurrency can make keys eligible (or not): re-check the ready set. Keys held
-- back by a per-key rate limit that no longer applies are released.
if ARGV[1] == 'keyed' then
  local before = redis.call('ZCARD', K_READY)
  if ARGV[5] ~= '1' then
    local held = redis.call('ZRANGE', K_LIMITED, 0, -1)
    redis.call('DEL', K_LIMITED)
    for _, key in ipairs(held) do
      refresh_key(key)
    end
  end
  for _, key in ipairs(redis.call('HKEYS', K_KEY_ACTIVE)) do
    refresh_key(key)
  end
  if before == 0 and redis.call('ZCARD', K_READY) > 0 then
    wake_workers()
  end
end
return {'ok'}
