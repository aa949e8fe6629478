-- lib/calls.lua: how a script calls Redis: the server clock, whole numbers as arguments, a list
-- of items in one command, and entries appended to a capped stream. Pasted by lib/layout.lua:
-- include that.
-- Needs: nothing.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A whole number (a time in ms, a count) as redis.call's argument: "%d" text, once per value and
-- script (Redis writes a Lua number with "%.17g", as dear as a short command: docs/performance.md).
-- Formatting one here costs more than Redis's writing of it once: this pays for a value passed
-- several times in a call (its `now`); a constant goes as literal text ('1').
local INT_ARG = {}
local function int_arg(n)
  local text = INT_ARG[n] or string.format('%d', n)
  INT_ARG[n] = text
  return text
end

-- redis.call(cmd, [key,] items...) for a list of items built up by a script (the ids of a
-- batch, score-member pairs): one call where a call per item would each pay for crossing into
-- Redis, in slices of 1,000 that unpack() can pass (Lua's stack holds about 8,000 values).
-- Returns the sum of the replies (what EXISTS, DEL or ZREM count).
local function call_sliced(items, cmd, key)
  local sum = 0
  for i = 1, #items, 1000 do
    local last = math.min(i + 999, #items)
    if key then
      sum = sum + redis.call(cmd, key, unpack(items, i, last))
    else
      sum = sum + redis.call(cmd, unpack(items, i, last))
    end
  end
  return sum
end

-- XADD of the fields `...` to `stream`, which keeps about `cap` entries: MAXLEN ~ on the first
-- entry a script appends to it and on every TRIM_EVERY-th after, not on each (the trim's
-- arguments cost an XADD about a fifth of its time, and an approximate trim removes whole
-- nodes of 100 entries anyway). The stream holds fewer than cap + 100 + TRIM_EVERY entries.
local TRIM_EVERY = 16
local APPENDED = {}
local function append_capped(stream, cap, ...)
  local n = (APPENDED[stream] or 0) + 1
  APPENDED[stream] = n
  if n % TRIM_EVERY == 1 then
    return redis.call('XADD', stream, 'MAXLEN', '~', int_arg(cap), '*', ...)
  end
  return redis.call('XADD', stream, '*', ...)
end
