-- batch_added: the batch's callbacks were added; it is never fired again and is kept only
-- for a while for info().
--
-- KEYS[1]  batch prefix "{b:<id>}:" (lib/batch_layout.lua)
-- ARGV     none
-- Returns  the batch's answer (lib/batch_layout.lua), status 'done'; {'gone'} when there is
--          no such batch.
-- Invariants: a batch is marked added once, and from then on answers 'done' and never fires again;
--          it is then kept for a day (DONE_TTL_MS, for info()) and expires.
--!include batch_layout.lua

if missing() then
  return {'gone'}
end
redis.call('HSET', K_STATE, 'added', '1')
keep_for(DONE_TTL_MS)
return answer('done')
