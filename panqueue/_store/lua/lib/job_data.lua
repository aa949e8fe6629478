-- lib/job_data.lua: how a job's data is stored in its hash: in field "d", or, when that keeps
-- the hash small, in up to eight parts "d", "d1" .. "d7" of at most 64 bytes each; and its
-- other fields written with it (put_field).
-- Needs: nothing (string work, and a read of the parts of a job's data beyond the first).
--
-- Redis keeps a hash whose every value is at most hash-max-listpack-value bytes (64 by
-- default) and that has at most hash-max-listpack-entries fields (128) as one listpack: one
-- allocation, about half the memory of a hash table with the same fields (a waiting job with
-- 105 bytes of data: 232 bytes against 400, MEMORY USAGE on Redis 7.0). Data of 65 to 512
-- bytes is therefore cut into parts of 64 bytes, provided the job's other values written with
-- it fit too (else the hash is a table anyway and parts would only add entries). Readers join
-- the parts in order (job_data below; panqueue/_store/ops/jobs.py parse_job); a job without
-- parts has its data whole in "d", as every job written before the parts existed.

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
