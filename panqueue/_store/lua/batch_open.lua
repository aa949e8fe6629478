-- batch_open: create a batch (open, empty). A resent call finds it and changes nothing.
--
-- KEYS[1]  batch prefix "{b:<id>}:" (lib/batch_layout.lua)
-- ARGV[1]  on_complete callback (msgpack [queue, data])   ARGV[2] on_success ('' = none)
-- ARGV[3]  parent batch id ('' = none; the callbacks are then jobs of that batch)
-- ARGV[4]  the last moment it may be created (ms, server clock; '' = any): when the callback
--          queues first look at the batch (panqueue/_store/ops/batches.py OPEN_GRACE_MS)
-- Returns  the batch's answer (lib/batch_layout.lua), status 'open'; {'!', message} when the
--          batch does not exist and its last moment has passed (nothing written).
-- Invariants: a batch is created once: a resent open finds it and changes none of its fields
--          (callbacks, parent, counts). Every change keeps the batch OPEN_TTL_MS longer
--          (lib/batch_layout.lua). No batch is created after its last moment, so a callback
--          queue that finds no batch when it first looks knows that none will come, and
--          forgets it (sweep_batches), and one that looked earlier did not look at all.
--!include batch_layout.lua

if redis.call('EXISTS', K_STATE) == 0 then
  if ARGV[4] ~= '' then
    local t = redis.call('TIME')
    if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) >= tonumber(ARGV[4]) then
      return {'!', 'opened too late (its request reached the server after its callback '
        .. 'queues stopped waiting for it): open another batch'}
    end
  end
  redis.call('HSET', K_STATE, 'oc', ARGV[1], 'os', ARGV[2], 'pa', ARGV[3], 'c', 0, 'f', 0,
    'closed', '0')
end
return settle()
