-- Delete tasks by hand from any state but active, releasing their uniqueness locks.
-- (The inspector cancels a waiting workflow first: it is archived when this runs.)
--
-- KEYS[1] -> rtq:{<queue>}:msg
-- KEYS[2] -> rtq:{<queue>}:state
-- KEYS[3] -> rtq:{<queue>}:info
-- KEYS[4] -> rtq:{<queue>}:result
-- KEYS[5] -> rtq:{<queue>}:priority
-- KEYS[6] -> rtq:{<queue>}:pending
-- KEYS[7] -> rtq:{<queue>}:scheduled
-- KEYS[8] -> rtq:{<queue>}:retry
-- KEYS[9] -> rtq:{<queue>}:archived
-- KEYS[10] -> rtq:{<queue>}:completed
-- KEYS[11] -> rtq:{<queue>}:progress
-- KEYS[12..] -> rtq:{<queue>}:unique:<key>, one per task that has a unique key
-- ARGV[1..] -> two per task: id, index of its unique key in KEYS (0 = none)
--
-- Returns: the number of tasks deleted.
local msg, state, info, result, priority = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local sources = {pending = KEYS[6], scheduled = KEYS[7], retry = KEYS[8], archived = KEYS[9], completed = KEYS[10]}

local deleted = 0
for i = 1, #ARGV, 2 do
  local id, unique_index = ARGV[i], tonumber(ARGV[i + 1])
  local source = sources[redis.call('HGET', state, id) or '']
  if source then
    redis.call('ZREM', source, id)
    redis.call('HDEL', msg, id)
    redis.call('HDEL', state, id)
    redis.call('HDEL', info, id)
    redis.call('HDEL', result, id)
    redis.call('HDEL', priority, id)
    redis.call('HDEL', KEYS[11], id)
    if unique_index > 0 then release_unique(KEYS[unique_index], id) end
    deleted = deleted + 1
  end
end
return deleted
