-- lib/wait_order.lua: the order of global mode's waiting jobs: a job's score (priority, then
-- FIFO by a sequence number), the renumbering of the sequence before it overflows, and the one
-- order over the two structures they wait in.
-- Needs: layout.lua.
--
-- Global mode keeps its waiting jobs in two places: the jobs of the default priority (0) in the
-- LIST "wl" (FIFO: RPUSH at the back, LPUSH of a stalled or released job at the front, LPOP by
-- the claim), every other priority in the ZSET "wait" (score: wait_score). A list entry costs a
-- few bytes where a sorted set's member costs about a hundred, and most queues use only the
-- default priority. The wait order is the sorted set's members with a priority above 0, then
-- the list, then the sorted set's members below 0 (wait_range). A member of priority 0 in the
-- sorted set (written before the list existed) goes before the list: it was there first.
--!include layout.lua

local MAX_PRIORITY = 1000000
-- The wait order (global mode) of a job is its sequence number below 2^32 (see wait_score).
local WAIT_SEQ_SPAN = 4294967296

-- Higher priority first, FIFO (by seq) within a priority. Exact in a double: the priority part
-- is below 2^21 and the sequence part below 2^32 (next_wait_seq keeps it there).
local function wait_score(priority, seq)
  return string.format('%d', (MAX_PRIORITY - priority) * WAIT_SEQ_SPAN + seq)
end

-- The sorted set's members scored below this (priority 0 and above) go before the list.
local WAIT_LIST_PLACE = '(' .. string.format('%d', (MAX_PRIORITY + 1) * WAIT_SEQ_SPAN)

-- Whether a job of this priority waits in the list (the default priority) or the sorted set.
local function waits_in_list(priority)
  return priority == 0
end

-- Take job `id` (hash `jkey`) out of the list: LREM is O(its distance from the end it scans
-- from), so it scans from the end whose job was enqueued nearer in time to this one's.
local function unlist(jkey, id)
  local first = redis.call('LINDEX', K_WAIT_LIST, 0)
  local last = redis.call('LINDEX', K_WAIT_LIST, -1)
  local from = 1
  if last == id then
    from = -1
  elseif first and first ~= id and last then
    local at = tonumber(redis.call('HGET', jkey, 'et') or '0')
    local first_at = tonumber(redis.call('HGET', job_key(first), 'et') or '0')
    local last_at = tonumber(redis.call('HGET', job_key(last), 'et') or '0')
    if at - first_at > last_at - at then
      from = -1
    end
  end
  redis.call('LREM', K_WAIT_LIST, int_arg(from), id)
end

-- Take up to `want` jobs off the front of the wait order (global mode, the claim). Returns a flat
-- list of id, place: the place is the job's wait-set score (kept with it for a requeue), or false
-- for a job from the list (a requeue puts it at the list's front).
local function pop_waiting(want)
  local popped = {}
  local function take_set(n)
    local found = redis.call('ZPOPMIN', K_WAIT, int_arg(n))
    for i = 1, #found, 2 do
      popped[#popped + 1] = found[i]
      popped[#popped + 1] = found[i + 1]
    end
  end
  local before = redis.call('ZCOUNT', K_WAIT, '-inf', WAIT_LIST_PLACE)
  if before > 0 then
    take_set(math.min(want, before))
  end
  local left = want - #popped / 2
  if left > 0 then
    local found = redis.call('LPOP', K_WAIT_LIST, int_arg(left))
    if found then
      for _, id in ipairs(found) do
        popped[#popped + 1] = id
        popped[#popped + 1] = false
      end
    end
    left = want - #popped / 2
  end
  if left > 0 then
    take_set(left)
  end
  return popped
end

-- The next wait sequence number. It would pass 2^32 after 4 billion enqueues; before it does,
-- the jobs that hold a place in the wait order are renumbered 1..n in the order they hold, and
-- the count restarts after them. Those jobs are the waiting ones and the active ones (a
-- stalled or released job goes back to its stored place, see requeue_waiting). This costs
-- one pass over them, once per 2^32 enqueues; every other enqueue stays O(log n).
local function next_wait_seq()
  local seq = redis.call('HINCRBY', K_META, 'seq', '1')
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
