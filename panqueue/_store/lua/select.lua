-- select: one page of the jobs of a queue that match a filter (a tag, states, an error type),
-- read on the server so that a filter over many jobs sends back only the matches.
-- panqueue/_store/ops/select.py lists them (client.list_jobs with tag= or error_type=) and
-- picks the jobs of the bulk operations (cancel_jobs, retry_failed, remove_jobs).
--
-- KEYS[1]  queue prefix
-- ARGV[1]  what to read: 'tag' (the index of the tag ARGV[2]), 'set' (the state set ARGV[2]:
--          wait, delayed, blocked, active, completed, failed or cancelled; wait is global
--          mode's wait order over its list and sorted set, lib/wait_order.lua), or 'ids' (the
--          ids ARGV[10..], a page of a listing the caller read: a keyed queue's waiting jobs)
-- ARGV[2]  the tag, or the state set's name
-- ARGV[3]  the states a match is in, comma-separated ('' = any)
-- ARGV[4]  the error type a match's last error has ('' = any)
-- ARGV[5]  the rank to start reading at   ARGV[6] 1 = read from the end (newest first)
-- ARGV[7]  how many matches to skip first   ARGV[8] most matches returned
-- ARGV[9]  most members read by this call (the rest is left for the next call)
-- Returns  {next rank (-1 when the source is read to its end), matches still to skip, id...}
-- Invariants: read-only. A tag's index holds exactly the stored jobs with that tag (add_job
--          writes it, delete_job takes the job out), so a job read from it exists unless it is a
--          leftover hash without a state, which never matches. Each call reads at most ARGV[9]
--          members, so a filter over a large set never holds the server long; the caller goes
--          on from the rank returned.
--!include layout.lua
--!include wait_pages.lua

local SETS = {wait = K_WAIT, delayed = K_DELAYED, blocked = K_BLOCKED, active = K_ACTIVE,
              completed = K_COMPLETED, failed = K_FAILED, cancelled = K_CANCELLED}
local source
if ARGV[1] == 'tag' then
  source = tag_key(ARGV[2])
elseif ARGV[1] == 'ids' then
  source = 'ids'
else
  source = SETS[ARGV[2]]
  if not source then
    return redis.error_reply('select: unknown state set ' .. ARGV[2])
  end
end
local states = nil
if ARGV[3] ~= '' then
  states = {}
  for state in string.gmatch(ARGV[3], '[^,]+') do
    states[state] = true
  end
end
local error_type = ARGV[4]
local rank = tonumber(ARGV[5])
local newest_first = ARGV[6] == '1'
local skip = tonumber(ARGV[7])
local want = tonumber(ARGV[8])
local budget = tonumber(ARGV[9])

local function matches(id)
  local jkey = job_key(id)
  if states then
    local state = redis.call('HGET', jkey, 's')
    if not state or not states[state] then
      return false
    end
  end
  if error_type ~= '' then
    local raw = redis.call('HGET', jkey, 'e')
    if not raw then
      return false
    end
    local ok, err = pcall(cmsgpack.unpack, raw)
    if not ok or type(err) ~= 'table' or err.type ~= error_type then
      return false
    end
  end
  return true
end

local found = {}
local members
if source == 'ids' then
  members = {unpack(ARGV, 10)}
  budget = #members + 1  -- read to the end
elseif source == K_WAIT then
  local total = waiting_count()
  if newest_first then
    members = {}
    if rank < total then
      local last = total - 1 - rank
      local range = wait_range(math.max(0, last - budget + 1), last)
      for i = #range, 1, -1 do
        members[#members + 1] = range[i]
      end
    end
  else
    members = wait_range(rank, rank + budget - 1)
  end
elseif newest_first then
  members = redis.call('ZREVRANGE', source, rank, rank + budget - 1)
else
  members = redis.call('ZRANGE', source, rank, rank + budget - 1)
end
local read = 0
for _, id in ipairs(members) do
  read = read + 1
  if matches(id) then
    if skip > 0 then
      skip = skip - 1
    else
      found[#found + 1] = id
      if #found >= want then
        break
      end
    end
  end
end
local next_rank = rank + read
if #members < budget and read == #members then
  next_rank = -1
end
local reply = {next_rank, skip}
for _, id in ipairs(found) do
  reply[#reply + 1] = id
end
return reply
