-- batch_close: no more jobs join the batch; it fires now if every job already ended (an
-- empty batch fires at once). Closing twice is closing once.
--
-- KEYS[1]  batch prefix "{b:<id>}:" (lib/batch_layout.lua)
-- ARGV     none
-- Returns  the batch's answer (lib/batch_layout.lua): 'fire' when its callbacks are due;
--          {'!', message} when there is no such batch.
-- Invariants: a closed batch stays closed; it fires (fired, set once) only when it is closed and
--          the ending of every registered job is recorded, so no job of it is pending when its
--          callbacks are added.
--!include batch_layout.lua

local refused = missing()
if refused then
  return refused
end
redis.call('HSET', K_STATE, 'closed', '1')
return settle()
