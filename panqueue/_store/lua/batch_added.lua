-- batch_added: the batch's callbacks were added; it is never fired again and is kept only
-- for a while for info().
--
-- KEYS[1]  batch prefix "{b:<id>}:" (lib/batch_layout.lua)
-- Returns  the batch's answer (lib/batch_layout.lua), status 'done'; {'gone'} when there is
--          no such batch.
--!include batch_layout.lua

if missing() then
  return {'gone'}
end
redis.call('HSET', K_STATE, 'added', '1')
keep_for(DONE_TTL_MS)
return answer('done')
