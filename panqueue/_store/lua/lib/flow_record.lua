-- lib/flow_record.lua: the record of a flow, which only flow.lua reads: the graph a person
-- sees, finished jobs included. The dependency edges (lib/dependencies.lua) go as soon as they
-- are done with, a completed dependency's at once; the record stays while its jobs do.
-- Needs: layout.lua.
--
-- For "B was added depending on A": B's hash field "dp" (the jobs B was added depending on,
-- one a line; ids are printable) and "flow:A" (SET of every job added depending on A, whatever
-- A's state then). delete_job (lib/retention.lua) deletes A's set with A and takes B out of
-- its dependencies' sets (forget_flow), so no part outlives its jobs.
--!include layout.lua

-- Record the flow of a new job `id` added depending on `deps` in its dependencies' sets (its
-- own "dp" goes with the job's other fields, flow_named). A dependency that no longer exists
-- gets no set: nothing would delete it. Nor does one that names the job's own id (a deleted
-- job whose id the new one takes, earlier in its batch): a job is in flow:A only while A is the
-- job it was added depending on, which flow.lua relies on.
local function record_flow(id, deps)
  for _, dep in ipairs(deps) do
    if dep ~= id and redis.call('EXISTS', job_key(dep)) == 1 then
      redis.call('SADD', flow_key(dep), id)
    end
  end
end

-- The "dp" field of a job added depending on `deps`: nil when it depends on none.
local function flow_named(deps)
  if #deps > 0 then
    return table.concat(deps, '\n')
  end
end

-- Job `id` is deleted: it leaves the records of the jobs it was added depending on (`named`:
-- its dp field, or nil). (Its own record, flow_key(id), is deleted with its hash.)
local function forget_flow(id, named)
  if named then
    for dep in string.gmatch(named, '[^\n]+') do
      redis.call('SREM', flow_key(dep), id)
    end
  end
end
