-- identity_reserve: a partitioned queue's add of a job whose custom id or dedup key has its home
-- here while the job goes to another partition (lib/identity.lua): decide the identity here, in
-- one step, before the job is added there. Also clears or extends a pointer, if unchanged.
--
-- KEYS[1]  queue prefix (the identity's home partition)
-- ARGV[1]  what: 'id' | 'dd' (reserve), 'clear', 'extend', 'forget'
-- ARGV[2]  for 'id': the custom id; for 'dd': the dedup key; for 'clear' / 'extend': 'id' or
--          'dd'; for 'forget': the custom id of a job deleted in its partition
-- ARGV[3]  for 'id' / 'dd': the pointer to write ("<partition>\t<token>\t<since>" for an id,
--          "<job id>\t<partition>\t<token>\t<since>" for a dedup key; since is replaced by
--          this server's clock); for 'clear' / 'extend': the id or dedup key; for 'forget':
--          "<partition>\t<token>", the pointer that named the deleted job
-- ARGV[4]  for 'dd': the dedup ttl ms; for 'clear' / 'extend': the pointer expected ('forget':
--          absent)
-- ARGV[5]  for 'dd': the dedup strategy (keep | extend | replace); for 'extend': the ttl ms
--          ('clear' and 'forget': absent)
-- Returns  reserve: {'won', pointer} (written, as stored), {'job', id} (the identity names a job
--          here: the add returns it), {'ptr', pointer} (another add's pointer: look at its
--          job first, identity_check.lua); 'clear' / 'extend' / 'forget': {'ok'} or {'moved'}
--          when the pointer is no longer the one expected (for 'forget': another add's).
-- Invariants: an identity names at most one live job; a pointer is written only where none is,
--          or over a plain dedup record whose job is gone or was replaced (as add does); a
--          pointer is replaced only by 'clear' of exactly that pointer, after its token was
--          fenced in its partition.
--!include layout.lua
--!include waiting.lua
--!include finish.lua
--!include identity.lua

local what = ARGV[1]
if what == 'forget' then
  local rkey = id_pointer_key(ARGV[2])
  local current = redis.call('GET', rkey)
  if not current or string.sub(current, 1, #ARGV[3] + 1) ~= ARGV[3] .. '\t' then
    return {'moved'}
  end
  redis.call('DEL', rkey)
  return {'ok'}
end
if what == 'clear' or what == 'extend' then
  local rkey
  if ARGV[2] == 'id' then
    rkey = id_pointer_key(ARGV[3])
  else
    rkey = dedup_key(ARGV[3])
  end
  if redis.call('GET', rkey) ~= ARGV[4] then
    return {'moved'}
  end
  if what == 'clear' then
    redis.call('DEL', rkey)
  else
    redis.call('PEXPIRE', rkey, tonumber(ARGV[5]))
  end
  return {'ok'}
end

local now = now_ms()
-- The pointer as stored: its last field, since, is this server's clock (the grace is measured
-- from it, identity_check.lua).
local pointer = string.gsub(ARGV[3], '[^\t]*$', tostring(now), 1)
local mine = string.match(ARGV[3], '^(.*)\t[^\t]*$')  -- the pointer less its time: a resend

if what == 'id' then
  local id = ARGV[2]
  if redis.call('EXISTS', job_key(id)) == 1 then
    return {'job', id}
  end
  local rkey = id_pointer_key(id)
  local current = redis.call('GET', rkey)
  if current then
    if string.match(current, '^(.*)\t[^\t]*$') == mine then
      return {'won', current}
    end
    return {'ptr', current}
  end
  redis.call('SET', rkey, pointer)
  return {'won', pointer}
end

-- 'dd'
local f = {dedup = ARGV[2], ttl = tonumber(ARGV[4]), strategy = ARGV[5]}
local dkey = dedup_key(f.dedup)
local current = redis.call('GET', dkey)
if current and is_pointer(current) then
  if string.match(current, '^(.*)\t[^\t]*$') == mine then
    return {'won', current}
  end
  return {'ptr', current}
end
local existing = dedup_existing(dkey, f, now)
if existing then
  return {'job', existing}
end
redis.call('SET', dkey, pointer, 'PX', f.ttl)
return {'won', pointer}
