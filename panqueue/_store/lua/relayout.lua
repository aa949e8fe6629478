-- relayout: one step of a change of a partitioned queue's layout (its partition count or the
-- naming of its partitions; panqueue/_store/ops/layout.py change_layout). This partition
-- becomes partition "<count>:<index>" of layout version ARGV[1], or, with "0:0", part of no
-- layout: only while it holds no job. Every add and every worker's setup names the layout
-- version it routes by (partition_problem, lib/layout.lua), so once a partition has moved, a
-- client that routes by another version is refused here and reads the layout again.
--
-- KEYS[1]  partition prefix
-- ARGV[1]  the new layout version ('' = only release the lock, see ARGV[3])
-- ARGV[2]  "<count>:<index>" in the new layout ("0:0": the partition is left out of it)
-- ARGV[3]  the change's lock token: '' for a partition other than the home. On the home the
--          step goes ahead only while the token holds the home's lock ("relayout", taken
--          with SET NX PX by the changer), and releases it
-- ARGV[4]  the placement (the home's, stored as pl; panqueue/_keys.py partition_tags)
-- Returns  {'ok'}, or {'!', 'holds jobs'}, {'!', 'holds batch endings'} (endings of batch jobs
--          not yet relayed to their batches: the changer relays them first), {'!', 'lock lost'},
--          or, on the home,
--          {'!', 'live workers <n>'} while n workers are registered (they serve the old layout;
--          heartbeat.lua): nothing changed
-- Invariants: a partition that holds a job never changes layout, so no job is ever left in a
--          partition outside its queue's layout; nor one whose batch outbox holds an ending, so
--          no ending is left where no worker of the new layout relays it. The home, where clients read the layout, moves
--          last and only under the lock, and never while a worker serves the old layout: until
--          then every client routes by the old layout, whose partitions the change has already
--          closed to it (they refuse, the client retries) or that still hold their jobs.
--!include layout.lua
--!include partition.lua

if ARGV[3] ~= '' and redis.call('GET', K_RELAYOUT) ~= ARGV[3] then
  return {'!', 'lock lost'}
end
if ARGV[1] == '' then
  redis.call('DEL', K_RELAYOUT)
  return {'ok'}
end
if ARGV[3] ~= '' then
  local live = redis.call('ZCOUNT', K_WORKERS, '(' .. now_ms(), '+inf')
  if live > 0 then
    return {'!', 'live workers ' .. live}
  end
end
if stored_jobs() > 0 then
  return {'!', 'holds jobs'}
end
if redis.call('ZCARD', K_BATCH_OUTBOX) > 0 then
  return {'!', 'holds batch endings'}
end
local count, index = string.match(ARGV[2], '^(%d+):(%d+)$')
redis.call('HSET', K_META, 'np', count, 'pi', index, 'lv', ARGV[1])
if ARGV[3] ~= '' then
  redis.call('HSET', K_META, 'pl', ARGV[4])
  redis.call('DEL', K_RELAYOUT)
end
return {'ok'}
