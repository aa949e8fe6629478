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
local wake = false
local reply = {}
for i = 0, n - 1 do
  local base = 2 + i * 6
  local id, created, woke = add_job(now, ARGV[base], ARGV[base + 1], tonumber(ARGV[base + 2]),
    tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4]), ARGV[base + 5], wait_was_empty)
  wake = wake or woke
  reply[#reply + 1] = id
  reply[#reply + 1] = created
end
if wake then
  wake_workers()
end
return reply
