-- lib/new_ids.lua: the ids a queue generates for jobs added without one: counter * partitions
-- + partition, from meta "id" (so id % partitions names the partition, panqueue/_keys.py route).
-- Needs: layout.lua, settings.lua.
--!include layout.lua
--!include settings.lua

-- Generated ids reserved by reserve_ids, {next, last} counter values (nil: none reserved).
local RESERVED_IDS = nil

-- Reserve `n` generated ids for the adds of this script, with one write of the counter instead
-- of one per job: only for `n` jobs that are sure to take one each, in order (add.lua: a batch
-- with no dedup key, whose items without a custom id each create a job), so that ids are what
-- one increment per job would have given them.
local function reserve_ids(n)
  if n > 1 then
    local last = redis.call('HINCRBY', K_META, 'id', n)
    RESERVED_IDS = {next = last - n + 1, last = last}
  end
end

-- The next generated id: counter * partitions + partition (panqueue/_keys.py route).
local function generated_id()
  local counter
  local reserved = RESERVED_IDS
  if reserved and reserved.next <= reserved.last then
    counter = reserved.next
    reserved.next = counter + 1
  else
    counter = redis.call('HINCRBY', K_META, 'id', '1')
  end
  local m = meta()
  return string.format('%d', counter * m.partitions + m.partition)
end
