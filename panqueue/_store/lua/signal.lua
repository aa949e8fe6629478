-- signal: send a durable job the signal `name` (client.signal): its payload is kept with the
-- job, after any others of that name, until a wait_for of that name takes it (signal_take.lua);
-- a job that waits for that name now (DELAYED, suspend.lua) is made WAITING in the same step.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  job id   ARGV[2] signal name   ARGV[3] payload (msgpack)   ARGV[4] request id
--          (fresh for each signal sent)
-- Returns  1 (kept), 0 when the job is final (nothing written), false when there is no such
--          job.
-- Invariants: a signal is never lost while its job can still run: it is kept until taken; a
--          final job is never changed; only the job that waits for this name is woken; a
--          resent call (its reply was lost) keeps nothing more: the request id is remembered
--          for SENT_MEMO_MS.
--!include layout.lua
--!include settings.lua
--!include waiting.lua
--!include memo.lua

local SENT_MEMO_MS = 60000
local sent = req_key(ARGV[4])
if redis.call('EXISTS', sent) == 1 then
  return 1
end
local id = ARGV[1]
local jkey = job_key(id)
local state = redis.call('HGET', jkey, 's')
if not state then
  return false
end
if state == 'completed' or state == 'failed' or state == 'cancelled' then
  return 0
end
local dkey = durable_key(id)
local name = ARGV[2]
local kept = redis.call('HGET', dkey, 'q:' .. name)
local list = {}
if kept then
  list = cmsgpack.unpack(kept)
end
list[#list + 1] = ARGV[3]
redis.call('HSET', dkey, 'q:' .. name, cmsgpack.pack(list))
if state == 'delayed' and redis.call('HGET', dkey, 'ws') == name then
  local before = claimable()
  redis.call('HDEL', dkey, 'ws')
  redis.call('ZREM', K_DELAYED, id)
  enqueue_waiting(jkey, id, nil, now_ms())
  emit('waiting', id, 's', 'waiting')
  wake_if_work_appeared(before)
end
redis.call('SET', sent, '1', 'PX', SENT_MEMO_MS)
return 1
