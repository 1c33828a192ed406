-- Archive tasks by hand: move them to archived from the states the caller allows (pending,
-- scheduled and retry: see broker/states.py), with the reason in their info, through
-- archive_task (_lib.lua): their uniqueness locks released, their records kept for the ORM
-- mirror when mirroring, and a workflow's child failing its workflow (a command), like a child
-- archived by its worker. Tasks in other states (or gone) are skipped.
--
-- KEYS[1] -> rtq:{<queue>}:state
-- KEYS[2] -> rtq:{<queue>}:archived
-- KEYS[3] -> rtq:{<queue>}:msg
-- KEYS[4] -> rtq:{<queue>}:commands
-- KEYS[5] -> rtq:{<queue>}:command
-- KEYS[6] -> rtq:{<queue>}:info
-- KEYS[7] -> rtq:{<queue>}:progress
-- KEYS[8] -> rtq:{<queue>}:finished
-- KEYS[9..] -> the sorted sets of the allowed states, in ARGV's order, then
--              rtq:{<queue>}:unique:<key>, one per task that has a unique key
-- ARGV[1] -> now (ms)
-- ARGV[2] -> 1 to keep the tasks' records for the ORM mirror, 0 not to
-- ARGV[3] -> the reason's error type (a class path)
-- ARGV[4] -> the reason's error message
-- ARGV[5] -> n, the number of allowed states
-- ARGV[6..] -> the n allowed states, then two per task: id, index of its unique key in KEYS (0 = none)
--
-- Returns: the number of tasks archived.
local t = {
  state = KEYS[1], archived = KEYS[2], msg = KEYS[3], commands = KEYS[4], command = KEYS[5],
  info = KEYS[6], progress = KEYS[7], finished = KEYS[8],
  now = tonumber(ARGV[1]), mirror = ARGV[2] == '1',
}
local error_type, error_message = ARGV[3], ARGV[4]
local sources, first_id = action_sources(5, 9)

local moved = 0
for i = first_id, #ARGV, 2 do
  local id, unique_index = ARGV[i], tonumber(ARGV[i + 1])
  local source = sources[redis.call('HGET', t.state, id) or '']
  if source then
    redis.call('ZREM', source, id)
    local lock = nil
    if unique_index > 0 then lock = KEYS[unique_index] end
    archive_task(t, id, info_with_reason(redis.call('HGET', t.info, id), error_type, error_message, t.now), lock)
    moved = moved + 1
  end
end
return moved
