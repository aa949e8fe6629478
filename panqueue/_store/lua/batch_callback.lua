-- batch_callback: add a fired batch's callbacks to this queue, once. The queue owes a batch
-- its callbacks while the batch is in its "batches" set (put there before the batch was
-- opened, panqueue/_store/ops/batches.py open_batch); this script adds them only while they
-- are owed, and takes the batch out of the set in the same step. So whoever fires the batch
-- again (a firer that died before marking the batch added, one that stalled after seeing it
-- fire, the sweep) adds nothing, even when the callback already ran and retention deleted it:
-- the callback's id alone could not tell, since an add of a deleted id creates it anew.
--
-- KEYS[1]  the callback queue's prefix: its first partition, where its "batches" set is
-- ARGV[1]  batch id
-- ARGV[2..] groups of 4, the callbacks owed to this queue (none: the batch's on_success, when
--          a job failed, is not added, but the queue owes the batch nothing more either):
--          callback job id (derived from the batch id, ops/batches.py callback_id), data
--          (msgpack), options (msgpack | ''), parent batch id ('' = none; the callback is then
--          a job of that batch, registered there when the child batch was opened)
-- Returns  1: the callbacks were owed and are added now; 0: nothing was owed (added before);
--          {'!', message}, nothing written and still owed, when the queue is keyed (a
--          callback has no key).
-- Invariants: a batch's callbacks are added to a queue at most once, ever; a callback is
--          created like any add (lib/new_job.lua add_job: WAITING, handed to an idle worker or
--          a wake-up published).
--!include layout.lua
--!include waiting.lua
--!include new_job.lua
--!include new_job_checks.lua
--!include handoff.lua

local batch = ARGV[1]
if not redis.call('ZSCORE', K_BATCHES, batch) then
  return 0
end
local mode, _, mode_stored = resolve_mode('')
if mode == 'keyed' then
  return {'!', "queue is keyed, and a batch's callback is added without a key: send it to a "
    .. 'global queue'}
end
if not mode_stored then
  redis.call('HSET', K_META, 'mode', mode)
  META = nil
end
local now = now_ms()
local before = claimable()
for i = 2, #ARGV, 4 do
  add_job(now, {id = ARGV[i], data = ARGV[i + 1], priority = 0, delay = 0, run_at = 0,
                options = ARGV[i + 2], key = '', deps = {}, dedup = '', ttl = 0,
                strategy = '', expires_in = 0, expires_at = 0, batch = ARGV[i + 3]})
end
redis.call('ZREM', K_BATCHES, batch)
wake_if_work_appeared(before, hand_off(now))
return 1
