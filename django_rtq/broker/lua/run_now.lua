-- Run tasks now: move them to pending from the states the caller allows (scheduled, retry and
-- archived: see broker/states.py). Tasks in other states (or gone) are skipped, and so are
-- workflows (is_workflow in _lib.lua): a workflow is not a runnable task, and one that
-- finished cannot run again.
--
-- Two narrowings, for "run again" (broker/manual.py): a filter by task name and by the class
-- of the last error (the info's error_type), which leaves other tasks where they are; and an
-- edit of one task's arguments, its stored message replaced by ARGV[5] only if it is still
-- ARGV[4] (no one edited it, nor deleted and enqueued it again, since it was read).
--
-- KEYS[1] -> rtq:{<queue>}:state
-- KEYS[2] -> rtq:{<queue>}:priority
-- KEYS[3] -> rtq:{<queue>}:pending
-- KEYS[4] -> rtq:{<queue>}:seq
-- KEYS[5] -> rtq:{<queue>}:msg
-- KEYS[6] -> rtq:{<queue>}:info
-- KEYS[7] -> rtq:{<queue>}:lanes
-- KEYS[8] -> rtq:{<queue>}:vclock
-- KEYS[9..] -> the sorted sets of the allowed states, in ARGV's order
-- ARGV[1] -> wake channel
-- ARGV[2] -> task name to run only ("" for any)
-- ARGV[3] -> error class to run only, as the info's error_type ("" for any)
-- ARGV[4] -> the message as read before the edit ("" for no edit)
-- ARGV[5] -> the edited message, which replaces it ("" for no edit)
-- ARGV[6] -> n, the number of allowed states
-- ARGV[7..] -> the n allowed states, then the task ids
--
-- Returns: the number of tasks moved.
local state, priority, pending, seq, msg, info = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local channel, only_task, only_error, before_edit, edited = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local sources, first_id = action_sources(6, 9)
-- A task with a partition goes to its partition's turn (push_pending).
local f = {pending = pending, seq = seq, msg = msg, lanes = KEYS[7], vclock = KEYS[8]}

local function decoded_field(raw, name)
  if not raw then return nil end
  local ok, decoded = pcall(cjson.decode, raw)
  if ok and type(decoded) == 'table' then return decoded[name] end
  return nil
end

local function wanted(id, message)
  if only_task ~= '' and decoded_field(message, 'task') ~= only_task then return false end
  if only_error ~= '' and decoded_field(redis.call('HGET', info, id), 'error_type') ~= only_error then
    return false
  end
  return before_edit == '' or message == before_edit
end

local before = claimable_count(pending)
local moved = 0
for i = first_id, #ARGV do
  local id = ARGV[i]
  local source = sources[redis.call('HGET', state, id) or '']
  local message = source and redis.call('HGET', msg, id)
  if source and not is_workflow(message) and wanted(id, message) then
    if edited ~= '' then
      message = edited
      redis.call('HSET', msg, id, edited)
    end
    redis.call('ZREM', source, id)
    push_pending(pending, seq, priority, state, id, false, nil, f, message)
    moved = moved + 1
  end
end
wake(pending, channel, before)
return moved
