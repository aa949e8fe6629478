-- workers: the live entries of the queue's worker registry; expired ones (a worker that died
-- without stopping) are pruned on the way.
--
-- KEYS[1]  queue prefix
-- ARGV     none
-- Returns  {now ms, name, expires at ms, record (msgpack), name, ...} of every live entry
--
-- Invariants: the same as heartbeat.lua's (an entry and its record go together).
--!include layout.lua

local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', K_WORKERS, '-inf', now, 'LIMIT', 0, 1000)
if #expired > 0 then
  redis.call('ZREM', K_WORKERS, unpack(expired))
  redis.call('HDEL', K_WORKER_INFO, unpack(expired))
end
local out = {now}
local live = redis.call('ZRANGEBYSCORE', K_WORKERS, '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  local record = redis.call('HGET', K_WORKER_INFO, live[i])
  if record then
    out[#out + 1] = live[i]
    out[#out + 1] = live[i + 1]
    out[#out + 1] = record
  end
end
return out
