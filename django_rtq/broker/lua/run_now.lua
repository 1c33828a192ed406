-- Run tasks now: move them to pending from the states the caller allows (scheduled, retry and
-- archived: see broker/states.py). Tasks in other states (or gone) are skipped, and so are
-- workflows (is_workflow in _lib.lua): a workflow is not a runnable task, and one that
-- finished cannot run again.
--
-- KEYS[1] -> rtq:{<queue>}:state
-- KEYS[2] -> rtq:{<queue>}:priority
-- KEYS[3] -> rtq:{<queue>}:pending
-- KEYS[4] -> rtq:{<queue>}:seq
-- KEYS[5] -> rtq:{<queue>}:msg
-- KEYS[6..] -> the sorted sets of the allowed states, in ARGV's order
-- ARGV[1] -> wake channel
-- ARGV[2] -> n, the number of allowed states
-- ARGV[3..] -> the n allowed states, then the task ids
--
-- Returns: the number of tasks moved.
local state, priority, pending, seq, msg = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local channel = ARGV[1]
local sources, first_id = action_sources(2, 6)

local before = claimable_count(pending)
local moved = 0
for i = first_id, #ARGV do
  local id = ARGV[i]
  local source = sources[redis.call('HGET', state, id) or '']
  if source and not is_workflow(redis.call('HGET', msg, id)) then
    redis.call('ZREM', source, id)
    push_pending(pending, seq, priority, state, id, false)
    moved = moved + 1
  end
end
wake(pending, channel, before)
return moved
