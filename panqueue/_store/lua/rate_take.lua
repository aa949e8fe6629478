-- rate_take: a partitioned queue's global rate limit. The window of recent starts lives in a slot
-- of its own ("{q:<queue>#rate}:rl"), so no partition's script can count it: a worker takes
-- starts from it first, claims at most that many jobs from one partition, and gives back (ZREM)
-- the starts it did not use.
--
-- A start is taken before its job starts, in another call, and the claim may come late (a
-- stalled worker, a slow network). So each start is a permit with a deadline: it is counted in
-- the window as if its job started at the deadline (its score), and the claim script refuses
-- permits whose deadline has passed (lua/claim.lua, start-by). A job therefore starts between
-- the take and its score, and its start stays in the window for at least the window's length
-- after it: the window never holds more than `max` starts of any one window's length of start
-- times, so the limit is never exceeded. The price is the grace: a start counts up to
-- grace ms longer than its job's real start (5 % of the window, at least 50 ms). A start
-- taken and not given back (a worker that died in between, or a claim that came too late and
-- could not give it back) only leaves the window less full until it ages out.
--
-- The limit itself is the workers' setting, stored nowhere else: each call keeps the one it was
-- given beside the window ("<window>:limit", STRING "<max>:<per>", living as long as a start in
-- the window can), so that explain (panqueue/_store/ops/explain.py) can ask this script, with
-- no start wanted, whether the window has room.
--
-- KEYS[1]  the queue's shared rate window (ZSET: start -> its deadline, ms)
-- ARGV[1]  starts wanted   ARGV[2] the limit (max)   ARGV[3] the window (ms)
-- ARGV[4]  a prefix unique to this call: the starts are "<prefix>:<i>"
-- Returns  {taken, wake_in, start_by, room}: how many starts were taken (named prefix:1 ..
--          prefix:taken); when none were, ms until the oldest start leaves the window; the
--          deadline (ms, this server's clock) by which the claim using them must run; and how
--          many starts the window had room for before this call took any.
-- Invariants: the window holds at most `max` starts; a start's score is its deadline.

-- The grace: GRACE_PERCENT of the window, at least GRACE_MIN_MS (docs/scaling.md says the same;
-- tests/test_lua_contract.py holds the two together).
local GRACE_PERCENT = 5
local GRACE_MIN_MS = 50

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key, wanted, max, per = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
-- Long enough for a take's reply and the claim's call (a round trip each, and a busy event
-- loop), short next to the window: the starts it over-counts are the limit's only cost.
local grace = math.max(GRACE_MIN_MS, math.floor(per * GRACE_PERCENT / 100))
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - per)
redis.call('SET', key .. ':limit', max .. ':' .. per, 'PX', per + grace + 1000)
local room = max - redis.call('ZCARD', key)
if room <= 0 then
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return {0, math.max(1, tonumber(oldest[2]) + per - now), 0, 0}
end
local taken = math.min(wanted, room)
for i = 1, taken do
  redis.call('ZADD', key, now + grace, ARGV[4] .. ':' .. i)
end
redis.call('PEXPIRE', key, per + grace + 1000)
return {taken, -1, now + grace, room}
