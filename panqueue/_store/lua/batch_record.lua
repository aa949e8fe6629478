-- batch_record: record the endings of jobs of the batch, relayed from one queue's batch
-- outbox. Each job counts once, whatever it ended as first: a relay may be repeated (a
-- relayer died before it removed the outbox entries), and a failed job retried from the
-- dead-letter set may end again.
--
-- KEYS[1]  batch prefix "{b:<id>}:" (lib/batch_layout.lua)
-- ARGV[1]  the jobs' queue   ARGV[2..] pairs: job id, state (completed | failed | cancelled |
--          removed: deleted before it ended)
-- Returns  the batch's answer (lib/batch_layout.lua), 'fire' once every job of the closed
--          batch ended; {'gone'} when there is no such batch (it expired: nothing to count).
-- Invariants: each registered job counts once, in c or f, however often its ending is relayed
--          ("ended" holds only registered jobs, and c + f is its size); the ending of a job that is
--          not registered counts nothing.
--!include batch_layout.lua

if missing() then
  return {'gone'}
end
for i = 2, #ARGV, 2 do
  local m = member(ARGV[1], ARGV[i])
  if redis.call('SISMEMBER', K_JOBS, m) == 1 and redis.call('SADD', K_ENDED, m) == 1 then
    redis.call('HINCRBY', K_STATE, ARGV[i + 1] == 'completed' and 'c' or 'f', 1)
  end
end
return settle()
