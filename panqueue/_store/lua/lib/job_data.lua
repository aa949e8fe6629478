-- lib/job_data.lua: how a job's data is stored in its hash: in field "d", or, when that keeps
-- the hash small, in up to eight parts "d", "d1" .. "d7" of at most 64 bytes each; and its
-- other fields written with it (put_field; a new job's hash: write_new_job).
-- Needs: layout.lua (int_arg).
--
-- Redis keeps a hash whose every value is at most hash-max-listpack-value bytes (64 by
-- default) and that has at most hash-max-listpack-entries fields (128) as one listpack: one
-- allocation, about half the memory of a hash table with the same fields (a waiting job with
-- 105 bytes of data: 232 bytes against 400, MEMORY USAGE on Redis 7.0). Data of 65 to 512
-- bytes is therefore cut into parts of 64 bytes, provided the job's other values written with
-- it fit too (else the hash is a table anyway and parts would only add entries). Readers join
-- the parts in order (job_data below; panqueue/_store/ops/jobs.py parse_job); a job without
-- parts has its data whole in "d", as every job written before the parts existed.
--!include layout.lua

local DATA_PART = 64
local DATA_FIELDS = {'d', 'd1', 'd2', 'd3', 'd4', 'd5', 'd6', 'd7'}

-- Whether a value fits a listpack hash as it is (at the default hash-max-listpack-value).
local function fits_part(value)
  return value == nil or value == false or #value <= DATA_PART
end

-- Appends the fields and values that store `data` to `args` (an HSET's arguments): in parts
-- when `parts` (the job's other values fit a listpack) and the data fits eight of them.
local function put_data(args, data, parts)
  local n = math.ceil(#data / DATA_PART)
  if not parts or n <= 1 or n > #DATA_FIELDS then
    args[#args + 1] = 'd'
    args[#args + 1] = data
    return
  end
  for i = 1, n do
    args[#args + 1] = DATA_FIELDS[i]
    args[#args + 1] = string.sub(data, (i - 1) * DATA_PART + 1, i * DATA_PART)
  end
end

-- Appends `field` and `value` to `args` (an HSET's arguments), unless the value is none ('').
local function put_field(args, field, value)
  if value and value ~= '' then
    args[#args + 1] = field
    args[#args + 1] = value
  end
end

-- Whether an optional field of a new job is at its default (nil or '').
local function unset(value)
  return not value or value == ''
end

-- Writes the hash `jkey` of a job add_job (lib/new_job.lua) makes, from `f` as it takes it, in
-- one HSET at `now`; `named`: its flow's "dp" (nil: none), `dedup`: its dedup key (nil: none),
-- `deadline`: its deadline to start by (nil: none), `waits`: whether it is WAITING now. A field
-- at its default is not written (priority 0, no attempt yet): a waiting job's hash is most of
-- the memory a queue of them takes. The data goes in parts where that keeps the hash a
-- listpack.
local function write_new_job(jkey, now, f, named, dedup, deadline, waits)
  if waits and f.priority == 0 and unset(f.options) and unset(f.key) and unset(f.batch)
      and unset(f.tags) and not f.pointed and not named and not dedup
      and #f.data <= DATA_PART then
    -- Every field but its data at its default, which fits one part: this write, without the
    -- work of finding which fields to write (a fifth of add_bulk's work per job).
    redis.call('HSET', jkey, 'et', int_arg(now), 'd', f.data, 's', 'waiting')
    return
  end
  local fields = {'et', int_arg(now)}
  if f.priority ~= 0 then
    fields[3] = 'p'
    fields[4] = int_arg(f.priority)
  end
  put_data(fields, f.data, fits_part(f.options) and fits_part(f.key) and fits_part(dedup)
    and fits_part(f.batch) and fits_part(f.tags) and fits_part(f.pointed) and fits_part(named))
  if waits then
    fields[#fields + 1] = 's'
    fields[#fields + 1] = 'waiting'
  end
  put_field(fields, 'o', f.options)
  put_field(fields, 'k', f.key)
  put_field(fields, 'b', f.batch)
  put_field(fields, 'tg', f.tags)
  put_field(fields, 'ih', f.pointed)  -- its id's pointer (lib/identity.lua)
  put_field(fields, 'dd', dedup)
  put_field(fields, 'dp', named)  -- the flow's record (lib/flow_record.lua)
  put_field(fields, 'x', deadline and int_arg(deadline))
  redis.call('HSET', jkey, unpack(fields))
end

-- The data of job hash `jkey` from the values of its first two parts, "d" and "d1", as a
-- reader's HMGET read them (nil: the job has no data). Only data of more than two parts sends
-- for the rest: every part but the last is exactly DATA_PART bytes, so a reader asks for two
-- fields where most jobs have one, not for eight (data of 65 to 128 bytes is two parts).
local function job_data(jkey, first, second)
  if not second then
    return first
  end
  if #second ~= DATA_PART then
    return first .. second
  end
  local parts = {first, second}
  for _, part in ipairs(redis.call('HMGET', jkey, unpack(DATA_FIELDS, 3))) do
    if not part then
      break
    end
    parts[#parts + 1] = part
  end
  return table.concat(parts)
end
