-- batch_info: read a batch (changes nothing).
--
-- KEYS[1]  batch prefix "{b:<id>}:" (lib/batch_layout.lua)
-- ARGV     none
-- Returns  the batch's answer (lib/batch_layout.lua): 'open', 'fire' or 'done'; {'gone'} when
--          there is no such batch.
-- Invariants: it changes nothing, not even the batch's lifetime: a batch nothing else touches
--          expires as if never read.
--!include batch_layout.lua

if missing() then
  return {'gone'}
end
local s = redis.call('HMGET', K_STATE, 'fired', 'added')
if s[2] == '1' then
  return answer('done')
end
return answer(s[1] == '1' and 'fire' or 'open')
