-- peers: the workers of the queue that claim now, by name: a partitioned queue's claim loops
-- share its partitions out among them (panqueue/_runtime/shares.py). Read from partition 0's
-- registry (every worker writes its entry in every partition).
--
-- KEYS[1]  queue prefix
-- ARGV     none
-- Returns  {name...}: the live entries (the first 1,000) whose record is not paused by a
--          command, has no blocked event loop and declares a concurrency above 0
--
-- Invariants: reads only; an entry is live while its score (its expiry) is in the future, as
-- heartbeat.lua writes it.
--!include layout.lua

local peers = {}
local live = redis.call('ZRANGEBYSCORE', K_WORKERS, '(' .. now_ms(), '+inf', 'LIMIT', 0, 1000)
if #live > 0 then
  local records = redis.call('HMGET', K_WORKER_INFO, unpack(live))
  for i, name in ipairs(live) do
    local info = records[i] and cmsgpack.unpack(records[i])
    if info and not info.paused and not info.loop_blocked_since
        and (tonumber(info.concurrency) or 0) > 0 then
      peers[#peers + 1] = name
    end
  end
end
return peers
