-- lib/wait_order.lua: the order of global mode's wait set: a job's score (priority, then
-- FIFO by a sequence number), and the renumbering of the sequence before it overflows.
-- Needs: layout.lua.
--!include layout.lua

local MAX_PRIORITY = 1000000
-- The wait order (global mode) of a job is its sequence number below 2^32 (see wait_score).
local WAIT_SEQ_SPAN = 4294967296

-- Higher priority first, FIFO (by seq) within a priority. Exact in a double: the priority part
-- is below 2^21 and the sequence part below 2^32 (next_wait_seq keeps it there).
local function wait_score(priority, seq)
  return string.format('%d', (MAX_PRIORITY - priority) * WAIT_SEQ_SPAN + seq)
end

-- The next wait sequence number. It would pass 2^32 after 4 billion enqueues; before it does,
-- the jobs that hold a place in the wait order are renumbered 1..n in the order they hold, and
-- the count restarts after them. Those jobs are the waiting ones and the active ones (a
-- stalled or released job goes back to its stored place, see requeue_waiting). This costs
-- one pass over them, once per 2^32 enqueues; every other enqueue stays O(log n).
local function next_wait_seq()
  local seq = redis.call('HINCRBY', K_META, 'seq', 1)
  if seq < WAIT_SEQ_SPAN then
    return seq
  end
  local held = {}
  local waiting = redis.call('ZRANGE', K_WAIT, 0, -1, 'WITHSCORES')
  for i = 1, #waiting, 2 do
    held[#held + 1] = {id = waiting[i], score = tonumber(waiting[i + 1]), waiting = true}
  end
  for _, id in ipairs(redis.call('ZRANGE', K_ACTIVE, 0, -1)) do
    local ws = redis.call('HGET', job_key(id), 'ws')
    if ws then
      held[#held + 1] = {id = id, score = tonumber(ws), waiting = false}
    end
  end
  -- Order by the old sequence number alone: priorities keep their part of the score.
  table.sort(held, function(a, b)
    return a.score % WAIT_SEQ_SPAN < b.score % WAIT_SEQ_SPAN
  end)
  for n, job in ipairs(held) do
    local priority_part = math.floor(job.score / WAIT_SEQ_SPAN)
    local ws = string.format('%d', priority_part * WAIT_SEQ_SPAN + n)
    if job.waiting then
      redis.call('ZADD', K_WAIT, ws, job.id)
    else
      redis.call('HSET', job_key(job.id), 'ws', ws)
    end
  end
  redis.call('HSET', K_META, 'seq', #held + 1)
  return #held + 1
end
