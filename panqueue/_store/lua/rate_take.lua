-- rate_take: a partitioned queue's global rate limit. The window of recent starts lives in a slot
-- of its own ("{q:<queue>#rate}:rl"), so no partition's script can count it: a worker takes
-- starts from it first, claims at most that many jobs from one partition, and gives back (ZREM)
-- the starts it did not use. The window never holds more than `max` starts, so the limit is
-- never exceeded; a start taken and not given back (a worker that died in between) only leaves
-- the window less full for its length.
--
-- KEYS[1]  the queue's shared rate window (ZSET: start -> when, ms)
-- ARGV[1]  starts wanted   ARGV[2] the limit (max)   ARGV[3] the window (ms)
-- ARGV[4]  a prefix unique to this call: the starts are "<prefix>:<i>"
-- Returns  {taken, wake_in}: how many starts were taken (named prefix:1 .. prefix:taken), and
--          when none were, ms until the oldest start leaves the window.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key, wanted, max, per = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - per)
local room = max - redis.call('ZCARD', key)
if room <= 0 then
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return {0, math.max(1, tonumber(oldest[2]) + per - now)}
end
local taken = math.min(wanted, room)
for i = 1, taken do
  redis.call('ZADD', key, now, ARGV[4] .. ':' .. i)
end
redis.call('PEXPIRE', key, per + 1000)
return {taken, -1}
