-- lib/dependencies.lua: the dependency edges between jobs, and what a dependency's ending does
-- to the jobs that wait for it (the endings themselves are lib/finish.lua's).
-- Needs: layout.lua, settings.lua (emit), waiting.lua (a released job goes to waiting).
--
-- An edge A -> B (B waits for A) is recorded on both sides, "deps:A" (SET of the jobs waiting
-- for A) and "needs:B" (SET of B's dependencies that have not completed). Both sides are
-- written and removed together: B is in deps:A exactly when A is in needs:B. An edge lives
-- while A may still complete and B may still need it: it goes when A completes
-- (release_dependents), when A will never complete (cancelled, deleted: forget_edges of A),
-- and when B will never run (cancelled, deleted: forget_edges of B; unlink_needs). A dependent
-- that failed because A failed keeps its edges, so that a retry of both knows B must wait for A.
-- Edges go when they are done with; the graph a person sees is kept apart (lib/flow_record.lua).
--!include layout.lua
--!include settings.lua
--!include waiting.lua

-- The edges of dependent `id` to its dependencies go: it will never run.
local function unlink_needs(id)
  local nkey = needs_key(id)
  for _, dep in ipairs(redis.call('SMEMBERS', nkey)) do
    redis.call('SREM', deps_key(dep), id)
  end
  redis.call('DEL', nkey)
end

-- Job `id` completed: the jobs blocked on it learn it, and the last dependency to complete
-- moves a blocked job on (to waiting, or to delayed when it was added with a delay still to
-- come). A dependent that failed with it earlier learns that it completed, for a later retry.
local function release_dependents(id, now)
  local dkey = deps_key(id)
  if redis.call('EXISTS', dkey) == 0 then
    return  -- the common case: nothing waits for this job (one read instead of two)
  end
  for _, dependent in ipairs(redis.call('SMEMBERS', dkey)) do
    local nkey = needs_key(dependent)
    redis.call('SREM', nkey, id)
    local djkey = job_key(dependent)
    if redis.call('HGET', djkey, 's') == 'blocked' and redis.call('SCARD', nkey) == 0 then
      redis.call('ZREM', K_BLOCKED, dependent)
      local run_at = tonumber(redis.call('HGET', djkey, 'ra') or '0')
      if run_at > now then
        redis.call('HSET', djkey, 's', 'delayed')
        redis.call('ZADD', K_DELAYED, run_at, dependent)
        emit('delayed', dependent, 'why', 'dependencies_completed')
      else
        enqueue_waiting(djkey, dependent, nil, now)
        emit('waiting', dependent, 'why', 'dependencies_completed')
      end
    end
  end
  redis.call('DEL', dkey)
end

-- The jobs blocked on job `id`, transitively, in the order a cascade reaches them (breadth
-- first): {id = dependent, via = the dependency it is blocked on}, each once. Reads only.
local function blocked_dependents(id)
  local found, seen = {}, {}
  local pending = {id}
  local i = 1
  while i <= #pending do
    for _, dependent in ipairs(redis.call('SMEMBERS', deps_key(pending[i]))) do
      if not seen[dependent] and redis.call('HGET', job_key(dependent), 's') == 'blocked' then
        seen[dependent] = true
        found[#found + 1] = {id = dependent, via = pending[i]}
        pending[#pending + 1] = dependent
      end
    end
    i = i + 1
  end
  return found
end

-- Job `id` will never complete nor run (cancelled, deleted): its edges on both sides go. Every
-- dependent forgets it and is marked (dx) so that no retry can move it back; a job that later
-- reuses the id starts with no edge. (The jobs still blocked on it must have failed first:
-- lib/finish.lua's fail_dependents.)
local function forget_edges(id)
  local dkey = deps_key(id)
  for _, dependent in ipairs(redis.call('SMEMBERS', dkey)) do
    local djkey = job_key(dependent)
    if redis.call('EXISTS', djkey) == 1 then
      redis.call('HSET', djkey, 'dx', id)
    end
    unlink_needs(dependent)
  end
  redis.call('DEL', dkey)
  unlink_needs(id)
end

-- A new job `id` names its dependencies `deps`: each distinct one that has not completed is an
-- edge (a set: naming one twice makes one edge). One that failed may still be retried: the job
-- fails now but keeps the edge. One that was cancelled or no longer exists (removed earlier in
-- the same batch, say) will never complete: no edge, the caller fails the job and marks it (dx).
-- Returns waiting (a dependency may still complete), the first failed one, the first lost one
-- and that one's state (nil: it no longer exists).
local function link_needs(id, deps)
  local waiting, failed_dep, lost_dep, lost_state = false, nil, nil, nil
  for _, dep in ipairs(deps) do
    local state = redis.call('HGET', job_key(dep), 's')
    if state == 'cancelled' or not state then
      if not lost_dep then
        lost_dep, lost_state = dep, state
      end
    elseif state ~= 'completed' then
      redis.call('SADD', needs_key(id), dep)
      redis.call('SADD', deps_key(dep), id)
      if state == 'failed' then
        failed_dep = failed_dep or dep
      else
        waiting = true
      end
    end
  end
  return waiting, failed_dep, lost_dep, lost_state
end
