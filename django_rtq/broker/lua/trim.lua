-- Delete completed tasks whose retention has ended, and archived tasks that are too old or
-- beyond the archive's size, at most `limit` of them: every column of each (drop_task in
-- _lib.lua). They were told to their workflows and mirrored when they finished.
--
-- KEYS[1] -> rtq:{<queue>}:completed
-- KEYS[2] -> rtq:{<queue>}:archived
-- KEYS[3] -> rtq:{<queue>}:msg
-- KEYS[4] -> rtq:{<queue>}:state
-- KEYS[5] -> rtq:{<queue>}:info
-- KEYS[6] -> rtq:{<queue>}:result
-- KEYS[7] -> rtq:{<queue>}:priority
-- KEYS[8] -> rtq:{<queue>}:progress
-- KEYS[9] -> rtq:{<queue>}:runs
-- ARGV[1] -> now (ms)
-- ARGV[2] -> archived before this (ms) are deleted
-- ARGV[3] -> the archive's largest size
-- ARGV[4] -> limit
--
-- Returns: the number of tasks deleted; the caller calls again until it gets 0.
local completed, archived = KEYS[1], KEYS[2]
local t = {
  msg = KEYS[3], state = KEYS[4], info = KEYS[5], result = KEYS[6], priority = KEYS[7],
  progress = KEYS[8], runs = KEYS[9],
}
local now, archive_cutoff, archive_max, limit = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

local doomed = redis.call('ZRANGE', completed, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
local from_archive = redis.call('ZRANGE', archived, '-inf', '(' .. archive_cutoff, 'BYSCORE', 'LIMIT', 0, limit - #doomed)
local excess = redis.call('ZCARD', archived) - #from_archive - archive_max
if excess > 0 then
  local room = limit - #doomed - #from_archive
  if excess > room then excess = room end
  if excess > 0 then
    local oldest = redis.call('ZRANGE', archived, #from_archive, #from_archive + excess - 1)
    for _, id in ipairs(oldest) do from_archive[#from_archive + 1] = id end
  end
end

for _, id in ipairs(doomed) do redis.call('ZREM', completed, id); drop_task(t, id) end
for _, id in ipairs(from_archive) do redis.call('ZREM', archived, id); drop_task(t, id) end
return #doomed + #from_archive
