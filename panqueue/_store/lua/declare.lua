-- declare: the first producer or worker of a queue that names its partition count stores the
-- queue's layout in the home meta, where every client reads it (the first declaration wins).
--
-- KEYS[1]  the queue's home prefix (partition 0)
-- ARGV[1]  partition count   ARGV[2] placement (panqueue/_keys.py partition_tags)
-- ARGV[3]  the producer's mode ('' | global | keyed), stored with a layout stored here when the
--          home has none: the mode the other partitions' first adds take
-- Returns  {np, pl, lv, mode} as stored (lv absent: version 0; mode absent: none yet)
-- Invariants: a stored layout changes only through relayout.lua; a queue that already has one
--          (even one stored before placements, without pl) keeps it.
--!include layout.lua

if not redis.call('HGET', K_META, 'np') then
  redis.call('HSET', K_META, 'np', ARGV[1], 'pi', 0, 'pl', ARGV[2])
  if (ARGV[3] or '') ~= '' then
    redis.call('HSETNX', K_META, 'mode', ARGV[3])
  end
end
return redis.call('HMGET', K_META, 'np', 'pl', 'lv', 'mode')
