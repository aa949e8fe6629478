-- lib/cancel_request.lua: telling the worker of an ACTIVE job that cancel(queue, id) was called.
-- Needs: layout.lua.
--
-- The job is marked (cx) and the request published on the notify channel as
-- "c" .. msgpack {id, lock token}. The lock token names the run the request is for: every
-- worker of the queue hears the message, and one that has no attempt of that run yet keeps it
-- for a while (its claim's reply may still be on its way), so the token is what keeps such a
-- request off a later run under the same id (the job removed and added again, or retried).
-- Whatever moves a marked job to a new lock token while it stays ACTIVE tells the request again
-- for the new token (withdraw_idle in lib/handoff.lua).
--!include layout.lua

local function tell_cancel(id, token)
  redis.call('SPUBLISH', K_NOTIFY, 'c' .. cmsgpack.pack({id, token}))
end
