-- lib/new_job_checks.lua: the checks every new job passes before anything is written (an add
-- checks every item of a batch first), and the queue mode an add resolves to.
-- Needs: layout.lua, settings.lua, wait_order.lua (MAX_PRIORITY).
--!include layout.lua
--!include settings.lua
--!include wait_order.lua

-- Times and durations an add may carry (ms): 2^52 ms is about 142,000 years. Any such value,
-- added to the server's clock, is still an exact integer in a double, Redis formats it without
-- an exponent, and PX / PEXPIRE accept it.
local MAX_TIME_MS = 4503599627370496

-- The queue's concurrency mode for an add: the stored one, else the producer's declaration,
-- else global. Returns mode or nil, error message; and, third, whether the mode is stored (an
-- add that goes ahead stores it if not, without reading it again).
local function resolve_mode(declared)
  local stored = meta().stored_mode
  if stored and declared ~= '' and declared ~= stored then
    return nil, 'queue mode mismatch: the queue is ' .. stored .. ', the producer says ' .. declared
  end
  return stored or (declared ~= '' and declared) or 'global', nil, stored ~= false
end

-- Whether `value` is a whole number in [low, high] (false for nil, NaN and the infinities).
local function whole_in(value, low, high)
  return value ~= nil and value == math.floor(value) and value >= low and value <= high
end

-- What is wrong with one job to add (`f` as add_job takes it), or nil. The add script checks
-- every item of a batch before it writes any: a value Redis would refuse half-way through
-- (a PX out of range, say) must not leave half a batch behind.
local function new_job_problem(f)
  if not whole_in(f.priority, -MAX_PRIORITY, MAX_PRIORITY) then
    return 'priority must be a whole number between -' .. MAX_PRIORITY .. ' and ' .. MAX_PRIORITY
  elseif not whole_in(f.delay, 0, MAX_TIME_MS) then
    return 'delay must be a whole number of ms between 0 and 2^52'
  elseif not whole_in(f.run_at, -MAX_TIME_MS, MAX_TIME_MS) then
    return 'run_at must be a whole number of ms since the epoch, at most 2^52 either way'
  elseif f.expires_in and not whole_in(f.expires_in, 0, MAX_TIME_MS) then
    return 'expires must be a whole number of ms between 0 and 2^52'
  elseif f.expires_at and not whole_in(f.expires_at, -MAX_TIME_MS, MAX_TIME_MS) then
    return 'expires_at must be a whole number of ms since the epoch, at most 2^52 either way'
  elseif f.dedup ~= '' and f.strategy ~= 'held' and not whole_in(f.ttl, 1, MAX_TIME_MS) then
    return 'dedup ttl must be a whole number of ms between 1 and 2^52'
  elseif f.dedup ~= '' and f.strategy ~= 'keep' and f.strategy ~= 'replace'
      and f.strategy ~= 'extend' and f.strategy ~= 'held' then
    return 'dedup strategy must be keep, replace or extend'
  end
  return nil
end
