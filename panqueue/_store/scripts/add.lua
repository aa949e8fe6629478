--!include _lib.lua
-- add: create jobs, WAITING or DELAYED. Idempotent for custom ids.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  number of jobs n, then n groups of six:
--          id ('' = generate), data (msgpack), priority, delay ms, run_at ms (epoch, 0 = none),
--          options (msgpack, '' = none)
-- Returns  {id1, created1, id2, created2, ...}; created is 0 when the id already existed (the
--          existing job is returned unchanged).
-- Invariants: a job is in exactly one of wait / delayed; generated ids are decimal and never
--          collide with custom ids (custom ids may not be all digits); idle workers are woken
--          when the wait set goes from empty to non-empty, or the earliest delayed time moves.

local n = tonumber(ARGV[1])
local now = now_ms()
local wait_was_empty = redis.call('ZCARD', K_WAIT) == 0
local woke = false
local reply = {}
for i = 0, n - 1 do
  local base = 2 + i * 6
  local id = ARGV[base]
  local created = 1
  if id == '' then
    id = tostring(redis.call('HINCRBY', K_META, 'id', 1))
  elseif redis.call('EXISTS', job_key(id)) == 1 then
    created = 0
  end
  if created == 1 then
    local jkey = job_key(id)
    local priority = tonumber(ARGV[base + 2])
    local delay = tonumber(ARGV[base + 3])
    local run_at = tonumber(ARGV[base + 4])
    if run_at == 0 and delay > 0 then
      run_at = now + delay
    end
    redis.call('HSET', jkey, 'd', ARGV[base + 1], 'p', priority, 'et', now, 'a', 0)
    if ARGV[base + 5] ~= '' then
      redis.call('HSET', jkey, 'o', ARGV[base + 5])
    end
    if run_at > now then
      redis.call('HSET', jkey, 's', 'delayed')
      redis.call('ZADD', K_DELAYED, run_at, id)
      emit('added', id, 's', 'delayed')
      local first = redis.call('ZRANGE', K_DELAYED, 0, 0)
      if first[1] == id and not woke then
        wake_workers()
        woke = true
      end
    else
      enqueue_waiting(jkey, id)
      emit('added', id, 's', 'waiting')
      if wait_was_empty and not woke then
        wake_workers()
        woke = true
      end
    end
  end
  reply[#reply + 1] = id
  reply[#reply + 1] = created
end
return reply
