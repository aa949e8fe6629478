-- flow: the graph around one job, read for a person (the dashboard's Flow section): its
-- dependencies, transitively (upstream), and its dependents, transitively (downstream), each
-- with its state, bounded. panqueue/_store/ops/flow.py reads the answer into a Flow.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  job id
-- ARGV[2]  most jobs shown (at least 1: the job itself)
-- ARGV[3]  most jobs looked at (at least ARGV[2]): past it the jobs not shown are no longer
--          counted
-- Returns  nil when the job does not exist; else {nodes, edges, hidden, counted}:
--   nodes    flat {id, state, depth, ...}, nearest first: state '' is a job that no longer
--            exists (or whose id now names another job, added after it was deleted);
--            depth < 0 upstream, 0 the job, > 0 downstream, by the shortest path
--   edges    flat {dependency, dependent, ...}, between shown jobs
--   hidden   how many jobs of the graph were found and not shown
--   counted  1: hidden counts every one; 0: the look stopped at ARGV[3] first
-- Invariants: read-only. The edges are read from the dependent's side, from what it was added
--          depending on (its hash's dp); the dependents from flow:<id> (lib/flow_record.lua).
--          A job stored before those were recorded has only its live edges, needs:<id> and
--          deps:<id> (lib/dependencies.lua): they are read instead. A job B is in
--          flow:A only while A is the job B was added depending on, so a name in dp whose job
--          does not list B there is a later job that took a deleted one's id: shown as removed.
--          No set is read past the look's budget, so a job with many dependents holds the
--          server no longer than a bounded read.
--!include layout.lua

local root, most, look = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local LINES = '[^\n]+'  -- dp holds the names one a line (ids are printable)

-- Per job: {state ('' gone), what it was added depending on ('' none)}.
local jobs = {}
local function job_of(id)
  local known = jobs[id]
  if not known then
    local f = redis.call('HMGET', job_key(id), 's', 'dp')
    known = {f[1] or '', f[2] or ''}
    jobs[id] = known
  end
  return known
end

if job_of(root)[1] == '' then
  return nil
end

-- Up to `room` members of SET `key`, and whether it holds more than were read.
local function members(key, room)
  local n = redis.call('SCARD', key)
  if room <= 0 then
    return {}, n > 0
  elseif n <= room then
    return n > 0 and redis.call('SMEMBERS', key) or {}, false
  end
  local found, cursor = {}, '0'
  repeat
    local page = redis.call('SSCAN', key, cursor, 'COUNT', room)
    cursor = page[1]
    for _, id in ipairs(page[2]) do
      if #found < room then
        found[#found + 1] = id
      end
    end
  until cursor == '0' or #found >= room
  return found, true
end

-- The names of job `id`'s dependencies: what it was added depending on (true: names that may
-- be stale, see is_stale), or, for a job stored before that was recorded, its live edges.
local function upstream(id)
  local dp = job_of(id)[2]
  if dp == '' then
    return redis.call('SMEMBERS', needs_key(id)), false
  end
  local names, seen = {}, {}
  for dep in string.gmatch(dp, LINES) do
    if not seen[dep] then
      seen[dep] = true
      names[#names + 1] = dep
    end
  end
  return names, true
end

-- Whether `dep`, named in job `id`'s dp, is now another job: one that does not list `id`
-- among the jobs added depending on it.
local function is_stale(dep, id)
  return job_of(dep)[1] ~= '' and redis.call('SISMEMBER', flow_key(dep), id) == 0
end

-- Up to `room` of the dependents of job `id`, and whether it has more: every job added
-- depending on it, or, for a job stored before that was recorded, its live edges.
local function downstream(id, room)
  if redis.call('EXISTS', flow_key(id), deps_key(id)) == 0 then
    return {}, false  -- the common case, a job nothing depends on: one read
  end
  local found, more = members(flow_key(id), room)
  if #found == 0 and not more then
    return members(deps_key(id), room)
  end
  return found, more
end

local depth, order, shown, gone = {[root] = 0}, {root}, {[root] = true}, {}
local hidden, counted, looked = 0, 1, 1
local pending = {root}

-- Job `id` met at `d` (`stale`: its name, met upstream, is a later job's): shown while there is
-- room, else counted, until the look's budget; a job that exists is looked at in turn.
local function reach(id, d, stale)
  if depth[id] then
    return
  end
  if looked >= look then
    counted = 0
    return
  end
  looked = looked + 1
  depth[id] = d
  gone[id] = stale or nil
  if #order < most then
    order[#order + 1] = id
    shown[id] = true
  else
    hidden = hidden + 1
  end
  -- A job gone has no edge left to follow. (A dependent not shown is not read, only its own
  -- dependents counted: one gone has none.)
  if not stale and ((d > 0 and not shown[id]) or job_of(id)[1] ~= '') then
    pending[#pending + 1] = id
  end
end

-- Breadth first from the job, upstream along dependencies and downstream along dependents, so
-- the nearest are shown first. Every shown job's edges are read from its own dependencies.
local edges, edge_seen = {}, {}
local i = 1
while i <= #pending do
  local id = pending[i]
  local d = depth[id]
  if d <= 0 or shown[id] then
    local names, recorded = upstream(id)
    for _, name in ipairs(names) do
      local new = d <= 0 and not depth[name]
      local drawn = shown[id] and shown[name]
      -- A name is read only if it is to be reached or drawn: a job may have many.
      local stale = recorded and (drawn or (new and looked < look)) and is_stale(name, id)
      if new then
        reach(name, d - 1, stale)
        drawn = shown[id] and shown[name]
      end
      -- A stale name is an edge only to the removed job it was shown as.
      if drawn and stale == (gone[name] == true) then
        local edge = name .. '\t' .. id
        if not edge_seen[edge] then
          edge_seen[edge] = true
          edges[#edges + 1] = name
          edges[#edges + 1] = id
        end
      end
    end
  end
  if d >= 0 then
    local found, more = downstream(id, look - looked)
    for _, dependent in ipairs(found) do
      reach(dependent, d + 1, false)
    end
    if more then
      counted = 0
    end
  end
  i = i + 1
end

local nodes = {}
for _, id in ipairs(order) do
  nodes[#nodes + 1] = id
  nodes[#nodes + 1] = gone[id] and '' or job_of(id)[1]
  nodes[#nodes + 1] = depth[id]
end
return {nodes, edges, hidden, counted}
