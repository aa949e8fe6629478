-- heartbeat: a worker's entry in the queue's worker registry, written once per beat, or removed
-- at a clean stop.
--
-- KEYS[1]  queue prefix
-- ARGV[1]  worker name   ARGV[2] entry TTL ms (0: remove the entry now)
-- ARGV[3]  the worker's record (msgpack map: host, pid, queues, concurrency, running, and
--          loop_blocked_ms when the worker's watchdog thread writes it while the event loop is
--          blocked: how long it has been)
-- ARGV[4]  a request id: take the commands queued for the worker (control.lua); '1' (a worker
--          of an earlier version): take them, with no request id; absent or '': leave them (a
--          beat of the watchdog's thread, which cannot apply them)
-- Returns  {the server time (ms) of the beat, command...}: the commands taken, oldest first
--
-- Invariants: a name is in "workers" exactly when it has a record in "worker_info"; the score
-- is when the entry expires (beat time + TTL). The script adds the server times to the record:
-- "beat" (this beat), "started" (the first beat of the entry, kept by later beats) and, for a
-- blocked loop, "loop_blocked_since" (now - loop_blocked_ms); a beat of the loop itself has
-- none, so the mark goes as soon as the loop beats again.
--          Commands are taken by the loop's own beat only, each once, in order, and only by
--          the process the live entry describes (same host and pid): a process that starts
--          under the name of one that is gone drops what was queued for that one. What a beat
--          took is kept under its request id for the entry's TTL: the same call sent again (its
--          reply lost, or a later write of the same beat failed) answers the same commands, so
--          none is lost with a reply.
--!include layout.lua

local name = ARGV[1]
local ttl = tonumber(ARGV[2])
local now = now_ms()
if ttl <= 0 then
  redis.call('ZREM', K_WORKERS, name)
  redis.call('HDEL', K_WORKER_INFO, name)
  return {now}
end
local record = cmsgpack.unpack(ARGV[3])
local started = now
local previous = redis.call('HGET', K_WORKER_INFO, name)
local same = false  -- the same process as the live entry's (not a new one under its name)
if previous and redis.call('ZSCORE', K_WORKERS, name) then
  local before = cmsgpack.unpack(previous)
  started = before.started or now
  same = before.pid == record.pid and before.host == record.host
end
record.started = started
record.beat = now
if record.loop_blocked_ms then
  record.loop_blocked_since = now - tonumber(record.loop_blocked_ms)
  record.loop_blocked_ms = nil
end
redis.call('ZADD', K_WORKERS, now + ttl, name)
redis.call('HSET', K_WORKER_INFO, name, cmsgpack.pack(record))
local reply = {now}
local request = ARGV[4] or ''
if request ~= '' then
  local memo = request ~= '1' and redis.call('GET', req_key(request))
  if memo then
    for _, command in ipairs(cmsgpack.unpack(memo)) do
      reply[#reply + 1] = command
    end
    return reply
  end
  local key = control_key(name)
  if same then
    for _, command in ipairs(redis.call('LRANGE', key, 0, -1)) do
      reply[#reply + 1] = command
    end
  end
  redis.call('DEL', key)  -- commands for an earlier process under this name are dropped
  if #reply > 1 and request ~= '1' then
    redis.call('SET', req_key(request), cmsgpack.pack({unpack(reply, 2)}), 'PX', ttl)
  end
end
return reply
