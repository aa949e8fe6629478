-- add: create jobs, WAITING, DELAYED or BLOCKED. Idempotent for custom ids; deduplicated by
-- dedup keys. All of a batch or none of it: every job is validated before anything is written.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  number of jobs n   ARGV[2] the producer's declared mode ('' | global | keyed)
-- ARGV[3]  the producer's declared partition ("<count>:<index>:<version>", '' = as stored;
--          lib/layout.lua partition_problem)
-- ARGV[4..] n pairs: the job's data (msgpack), and its other fields as a msgpack array of 14,
--          or '' for the same fields as the item before (the first item: each at its default,
--          the value in brackets): id ('' = generate), priority (0), delay ms (0), run_at ms
--          (0 = none), options (msgpack | ''), key ('' = none), dependencies (msgpack list of
--          ids | ''), dedup key (''), dedup ttl ms (0), dedup strategy (''), expires in ms
--          (0 = none; from the server's clock), expires at ms (0 = none): the deadline to start
--          by (lib/expiry.lua; an add past it ends the job CANCELLED), batch id ('' = none;
--          registered in the batch beforehand, panqueue/_batch.py; after a tab: the id's ending
--          is recorded in the batch already, batch_register.lua, so the add may return the job
--          it names but not create it: refused otherwise), tags ('' = none; separated by
--          newlines, each indexed in "tag:<tag>"). An add_bulk's items share their fields, so
--          each after the first is two arguments
--          then (absent when no item has one) n tokens: item i's identity token ('' = none),
--          when a pointer in another partition names the job (lib/identity.lua), followed by
--          "\t<partition>" when that partition holds its custom id's pointer (the job keeps it,
--          field ih); an add whose token was fenced here is refused
-- Returns  {id1, created1, ...}; or {'!', message} when the batch is refused (nothing written):
--          an item with a value out of range (new_job_problem, lib/new_job_checks.lua), a key that
--          does not fit the queue's mode, a layout that is not this partition's ('layout
--          changed': the producer reads the layout again and routes anew), or an unknown
--          dependency (checked before the item's identity, whatever its id or dedup key
--          names), an id of a batch job that ended and no longer exists (in the batch or in
--          this partition's batch outbox: the batch counts each id once); {'\t~', i} when
--          item i's token was fenced (its identity went to another add: look again);
--          {'\t?', i, kind, name, pointer} when item i's custom id (kind 'id') or dedup key
--          ('dd') has its home here and a pointer to a job in another partition
--          (lib/identity.lua), which the producer must look at first.
-- Invariants: a job is in exactly one state set; keyed queues get keyed jobs only and global
--          queues unkeyed ones; dependencies exist (in the queue or earlier in the batch);
--          claimable work goes straight to idle workers that registered for it
--          (lib/handoff.lua), and idle workers are woken for what is left.
--          A dependency on an earlier item of the batch means the job that item resolved to:
--          when the item's id was not created (a dedup no-op returned another job), that job;
--          when it was deleted since (a later dedup replace), it no longer exists and the
--          dependent fails at once (add_job). No dependent waits for a job that is not there.
--!include layout.lua
--!include settings.lua
--!include partition.lua
--!include waiting.lua
--!include new_job.lua
--!include new_job_checks.lua
--!include handoff.lua

local n = tonumber(ARGV[1])
local mode, problem, mode_stored = resolve_mode(ARGV[2])
if not mode then
  return {'!', problem}
end
problem = partition_problem(ARGV[3])
if problem then
  return {'!', problem}
end
local jobs = {}
local datas = {}  -- each item's data, beside its table in `jobs`
local batch_ids = {}
local g = {'', 0, 0, 0, '', '', '', '', 0, '', 0, 0, '', ''}  -- the fields of ARGV[4..]

-- Item i (its arguments from ARGV[b]; `own`: its identity token argument, nil when no item has
-- one), checked: its table for add_job (all but its data), or nil and the reply that refuses
-- the add.
local function checked_item(i, b, own)
  if ARGV[b + 1] ~= '' then
    g = cmsgpack.unpack(ARGV[b + 1])
  end
  local f = {id = g[1], priority = tonumber(g[2]), delay = tonumber(g[3]),
             run_at = tonumber(g[4]), options = g[5], key = g[6], deps = {}, dedup = g[8],
             ttl = tonumber(g[9]), strategy = g[10], expires_in = tonumber(g[11]),
             expires_at = tonumber(g[12]), batch = g[13], tags = g[14]}
  local ended_in_batch = f.batch:sub(1, 1) == '\t'
  if ended_in_batch then
    f.batch = f.batch:sub(2)
  elseif f.batch ~= '' and f.id ~= '' then
    -- An ending of the id not yet relayed to the batch counts as recorded (lib/finish.lua).
    for _, state in ipairs({'completed', 'failed', 'cancelled', 'removed'}) do
      if redis.call('ZSCORE', K_BATCH_OUTBOX, f.batch .. '\t' .. f.id .. '\t' .. state) then
        ended_in_batch = true
      end
    end
  end
  -- An item with the fields of the item before ('') passed the same checks with it.
  local bad = (i == 0 or ARGV[b + 1] ~= '') and new_job_problem(f)
  if bad then
    return nil, {'!', 'item ' .. i .. ': ' .. bad}
  end
  if mode == 'keyed' and f.key == '' then
    return nil, {'!', 'item ' .. i .. ': queue is keyed: add(..., key=...) is required'}
  elseif mode == 'global' and f.key ~= '' then
    return nil, {'!', 'item ' .. i ..
      ": key= needs a keyed queue (mode='keyed'); this queue is global"}
  end
  local token, id_home = '', ''
  if own then
    token, id_home = string.match(own, '^([^\t]*)\t?(.*)$')
  end
  if id_home ~= '' then
    f.pointed = id_home .. '\t' .. token
  end
  if token ~= '' and redis.call('EXISTS', fence_key(token)) == 1 then
    return nil, {'\t~', i}
  end
  if f.strategy == 'held' and token == '' then
    return nil, {'!', 'item ' .. i .. ': a dedup key held elsewhere needs its identity token'}
  end
  -- Dependencies first: an unknown one refuses the add whatever its id or dedup key names.
  -- An item with a token had its dependencies checked by its producer before its identities
  -- were decided in their homes (ops/identity.py add_placed), as here: a dedup replace decided
  -- there may have deleted one since, which fails the job (add_job), as a replace here does.
  if g[7] ~= '' then
    f.deps = cmsgpack.unpack(g[7])  -- a table of the item's own: resolved ids replace its ids
    for _, dep in ipairs(f.deps) do
      if token == '' and not batch_ids[dep] and redis.call('EXISTS', job_key(dep)) == 0 then
        return nil, {'!', 'item ' .. i .. ': dependency ' .. dep ..
          ' is not a job of this queue'}
      end
    end
  end
  -- An id that names a job here is returned as it is (add_job): its pointers are not looked at.
  local id_here = f.id ~= '' and (batch_ids[f.id] or redis.call('EXISTS', job_key(f.id)) == 1)
  if f.id ~= '' and not id_here then
    local pointer = redis.call('GET', id_pointer_key(f.id))
    if pointer then
      return nil, {'\t?', i, 'id', f.id, pointer}
    end
  end
  if f.dedup ~= '' and f.strategy ~= 'held' and not id_here then
    local record = redis.call('GET', dedup_key(f.dedup))
    if record and is_pointer(record) then
      return nil, {'\t?', i, 'dd', f.dedup, record}
    end
  end
  -- The batch counts each id once: created again, the job would count as ended while it waits.
  if ended_in_batch and not id_here then
    return nil, {'!', 'item ' .. i .. ": job id '" .. f.id .. "' already ended in batch '" ..
      f.batch .. "' (a batch counts each id once): add it under another id"}
  end
  if f.id ~= '' then
    batch_ids[f.id] = true
  end
  return f
end

local f = nil  -- the table of the item before
for i = 0, n - 1 do
  local b = 4 + i * 2
  local own = ARGV[4 + n * 2 + i]
  -- An item with the fields of the item before ('') that has nothing of its own to check or
  -- keep (a generated id, no dependencies, no token) shares that item's table: it passed the
  -- same checks (add_bulk's items, a table each, were a tenth of the add's work).
  if not (ARGV[b + 1] == '' and f and f.id == '' and #f.deps == 0 and not f.pointed
          and (own or '') == '') then
    local refused
    f, refused = checked_item(i, b, own)
    if not f then
      return refused
    end
  end
  jobs[#jobs + 1] = f
  datas[#jobs] = ARGV[b]
end
if not mode_stored then
  redis.call('HSET', K_META, 'mode', mode)
  META = nil
end
store_partition(ARGV[3])
-- Without a dedup key, every item without a custom id creates a job: one write reserves their ids.
local generated = 0
for _, f in ipairs(jobs) do
  if f.dedup ~= '' then
    generated = 0
    break
  end
  if f.id == '' then
    generated = generated + 1
  end
end
reserve_ids(generated)
local now = now_ms()
local before = claimable()
local reply = {}
local resolved = {}  -- an item's requested id -> the id it returned, when they differ
for i, f in ipairs(jobs) do
  if #f.deps > 0 then
    for k, dep in ipairs(f.deps) do
      f.deps[k] = resolved[dep] or dep
    end
  end
  f.data = datas[i]  -- items that share a table differ in their data alone
  local id, created = add_job(now, f)
  if f.id ~= '' and id ~= f.id then
    resolved[f.id] = id
  end
  reply[#reply + 1] = id
  reply[#reply + 1] = created
end
wake_if_work_appeared(before, hand_off(now))
return reply
