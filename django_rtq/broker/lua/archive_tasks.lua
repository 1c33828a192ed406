-- Archive tasks by hand: move them from pending, scheduled or retry to archived and release
-- their uniqueness locks. Tasks in other states (or gone) are skipped. A workflow's child
-- archived so fails its workflow (a command), like a child archived by its worker.
--
-- KEYS[1] -> rtq:{<queue>}:state
-- KEYS[2] -> rtq:{<queue>}:pending
-- KEYS[3] -> rtq:{<queue>}:scheduled
-- KEYS[4] -> rtq:{<queue>}:retry
-- KEYS[5] -> rtq:{<queue>}:archived
-- KEYS[6] -> rtq:{<queue>}:msg
-- KEYS[7] -> rtq:{<queue>}:commands
-- KEYS[8] -> rtq:{<queue>}:command
-- KEYS[9..] -> rtq:{<queue>}:unique:<key>, one per task that has a unique key
-- ARGV[1] -> now (ms)
-- ARGV[2..] -> two per task: id, index of its unique key in KEYS (0 = none)
--
-- Returns: the number of tasks archived.
local state, archived = KEYS[1], KEYS[5]
local sources = {pending = KEYS[2], scheduled = KEYS[3], retry = KEYS[4]}
local msg, commands, command = KEYS[6], KEYS[7], KEYS[8]
local now = ARGV[1]
local ARCHIVED_INFO = '{"error_type":"django_rtq.exceptions.TaskCancelled","error":"archived by hand"}'

local moved = 0
for i = 2, #ARGV, 2 do
  local id, unique_index = ARGV[i], tonumber(ARGV[i + 1])
  local source = sources[redis.call('HGET', state, id) or '']
  if source then
    redis.call('ZREM', source, id)
    redis.call('ZADD', archived, now, id)
    redis.call('HSET', state, id, 'archived')
    if unique_index > 0 then release_unique(KEYS[unique_index], id) end
    local ok, message = pcall(cjson.decode, redis.call('HGET', msg, id) or '')
    if ok then notify_failure(commands, command, id, message, ARCHIVED_INFO, tonumber(now)) end
    moved = moved + 1
  end
end
return moved
