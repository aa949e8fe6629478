-- lib/job_keys.lua: the keys of one job (its hash, its logs, its durable record, its dependency
-- edges), derived from the queue prefix P. Pasted by lib/layout, after P: include that.
-- Needs: nothing (P is defined by the include that pastes this one).

local function job_key(id)
  return P .. 'job:' .. id
end

local function logs_key(id)
  return P .. 'job:' .. id .. ':logs'
end

local function durable_key(id)
  return P .. 'job:' .. id .. ':durable'
end

-- Dependency edges (lib/dependencies.lua).
local function deps_key(id)
  return P .. 'deps:' .. id
end

local function needs_key(id)
  return P .. 'needs:' .. id
end

-- The record of a job's dependents, kept while it lives, for reading a flow (flow.lua).
local function flow_key(id)
  return P .. 'flow:' .. id
end
