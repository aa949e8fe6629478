-- batch_open: create a batch (open, empty). A resent call finds it and changes nothing.
--
-- KEYS[1]  batch prefix "{b:<id>}:" (lib/batch_layout.lua)
-- ARGV[1]  on_complete callback (msgpack [queue, data])   ARGV[2] on_success ('' = none)
-- ARGV[3]  parent batch id ('' = none; the callbacks are then jobs of that batch)
-- Returns  the batch's answer (lib/batch_layout.lua), status 'open'.
-- Invariants: a batch is created once: a resent open finds it and changes none of its fields
--          (callbacks, parent, counts). Every change keeps the batch OPEN_TTL_MS longer
--          (lib/batch_layout.lua).
--!include batch_layout.lua

if redis.call('EXISTS', K_STATE) == 0 then
  redis.call('HSET', K_STATE, 'oc', ARGV[1], 'os', ARGV[2], 'pa', ARGV[3], 'c', 0, 'f', 0,
    'closed', '0')
end
return settle()
