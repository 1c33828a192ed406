-- Delete tasks by hand from the states the caller allows (see broker/states.py; the caller
-- cancels a waiting workflow first, so it is archived when this runs). A task that had not
-- finished ends as an archived one does first, through archive_task (_lib.lua), with the
-- reason: its uniqueness lock released, its record kept for the ORM mirror when mirroring,
-- and a workflow's child failing its workflow (a command). Then every column of the task goes
-- (drop_task). Tasks in other states (or gone) are skipped.
--
-- KEYS[1] -> rtq:{<queue>}:msg
-- KEYS[2] -> rtq:{<queue>}:state
-- KEYS[3] -> rtq:{<queue>}:info
-- KEYS[4] -> rtq:{<queue>}:result
-- KEYS[5] -> rtq:{<queue>}:priority
-- KEYS[6] -> rtq:{<queue>}:archived
-- KEYS[7] -> rtq:{<queue>}:progress
-- KEYS[8] -> rtq:{<queue>}:runs
-- KEYS[9] -> rtq:{<queue>}:finished
-- KEYS[10] -> rtq:{<queue>}:commands
-- KEYS[11] -> rtq:{<queue>}:command
-- KEYS[12..] -> the sorted sets of the allowed states, in ARGV's order, then
--               rtq:{<queue>}:unique:<key>, one per task that has a unique key
-- ARGV[1] -> now (ms)
-- ARGV[2] -> 1 to keep the records of tasks that had not finished for the ORM mirror, 0 not to
-- ARGV[3] -> the reason's error type (a class path)
-- ARGV[4] -> the reason's error message
-- ARGV[5] -> n, the number of allowed states
-- ARGV[6..] -> the n allowed states, then two per task: id, index of its unique key in KEYS (0 = none)
--
-- Returns: the number of tasks deleted.
local t = {
  msg = KEYS[1], state = KEYS[2], info = KEYS[3], result = KEYS[4], priority = KEYS[5],
  archived = KEYS[6], progress = KEYS[7], runs = KEYS[8], finished = KEYS[9],
  commands = KEYS[10], command = KEYS[11], now = tonumber(ARGV[1]), mirror = ARGV[2] == '1',
}
local error_type, error_message = ARGV[3], ARGV[4]
local sources, first_id = action_sources(5, 12)
local ended = {archived = true, completed = true}

local deleted = 0
for i = first_id, #ARGV, 2 do
  local id, unique_index = ARGV[i], tonumber(ARGV[i + 1])
  local state = redis.call('HGET', t.state, id) or ''
  local source = sources[state]
  if source then
    local lock = nil
    if unique_index > 0 then lock = KEYS[unique_index] end
    redis.call('ZREM', source, id)
    if ended[state] then
      release_unique(lock, id)
    else
      archive_task(t, id, info_with_reason(redis.call('HGET', t.info, id), error_type, error_message, t.now), lock)
      redis.call('ZREM', t.archived, id)
    end
    drop_task(t, id)
    deleted = deleted + 1
  end
end
return deleted
