-- batch_unregister: take back registrations of jobs that were not added to the batch (the add
-- failed, or returned a job that existed already outside the batch). A job whose ending was
-- recorded stays. May fire the batch: it can be closed and waiting only for these.
--
-- KEYS[1]  batch prefix "{b:<id>}:" (lib/batch_layout.lua)
-- ARGV[1]  the jobs' queue   ARGV[2..] job ids
-- Returns  the batch's answer (lib/batch_layout.lua); {'gone'} when there is no such batch.
-- Invariants: only registrations whose ending was not recorded are taken back, so c + f stays the
--          size of "ended", at most that of "jobs"; a closed batch that waited only for these fires
--          here.
--!include batch_layout.lua

if missing() then
  return {'gone'}
end
for i = 2, #ARGV do
  local m = member(ARGV[1], ARGV[i])
  if redis.call('SISMEMBER', K_ENDED, m) == 0 then
    redis.call('SREM', K_JOBS, m)
  end
end
return settle()
