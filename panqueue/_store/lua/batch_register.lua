-- batch_register: make jobs members of a batch before they are added (so the batch cannot
-- look finished while they are being added). Registering a job twice counts it once.
--
-- KEYS[1]  batch prefix "{b:<id>}:" (lib/batch_layout.lua)
-- ARGV[1]  the jobs' queue   ARGV[2] '1': the jobs are a child batch's callbacks, which may
--          join a closed batch (a running job of it opens the child, so it cannot have fired)
-- ARGV[3]  the outbox their endings will be in: "<queue>\t<batch_outbox key of the queue's
--          partition they are added to>" (kept as a name: this script touches no key of it)
-- ARGV[4..] job ids
-- Returns  the batch's answer (lib/batch_layout.lua), followed by the given ids that were
--          members already, each after 'e' when the batch recorded its ending ('m' if not):
--          the batch counts each id once, so an ended id may only be returned as the job it
--          names, never created again (add.lua refuses that), and a refused add takes back
--          only the ids it registered; or
--          {'!', message}, nothing written, when the batch does not exist, has fired, or is
--          closed (and these are not callbacks).
-- Invariants: a job is registered before it is added, so the batch cannot fire while the job is on
--          its way; no job joins a fired batch, nor a closed one (a child batch's callbacks aside);
--          an id whose ending was recorded is never counted again.
--!include batch_layout.lua

local refused = missing()
if refused then
  return refused
end
local s = redis.call('HMGET', K_STATE, 'closed', 'fired')
if s[2] == '1' then
  return {'!', 'the batch has finished (its callbacks are due): no job can join it'}
elseif s[1] == '1' and ARGV[2] ~= '1' then
  return {'!', 'the batch is closed (batch.close()): no job can join it'}
end
local queue = ARGV[1]
redis.call('SADD', K_QUEUES, ARGV[3])
-- SADD in slices: unpack() of a whole add_bulk chunk could pass Lua's stack limit.
local slice = {}
local known = {}
for i = 4, #ARGV do
  slice[#slice + 1] = member(queue, ARGV[i])
  if redis.call('SISMEMBER', K_ENDED, slice[#slice]) == 1 then
    known[#known + 1] = 'e' .. ARGV[i]
  elseif redis.call('SISMEMBER', K_JOBS, slice[#slice]) == 1 then
    known[#known + 1] = 'm' .. ARGV[i]
  end
  if #slice == 1000 or i == #ARGV then
    redis.call('SADD', K_JOBS, unpack(slice))
    slice = {}
  end
end
local reply = settle()
for _, id in ipairs(known) do
  reply[#reply + 1] = id
end
return reply
