-- Return active tasks to the front of pending without counting an attempt: a worker shutting
-- down gives back the tasks it will not finish (never one whose handler still runs), or one
-- handed to it when it had no room.
--
-- KEYS[1] -> rtq:{<queue>}:active
-- KEYS[2] -> rtq:{<queue>}:owner
-- KEYS[3] -> rtq:{<queue>}:state
-- KEYS[4] -> rtq:{<queue>}:priority
-- KEYS[5] -> rtq:{<queue>}:pending
-- KEYS[6] -> rtq:{<queue>}:seq
-- KEYS[7] -> rtq:{<queue>}:unstarted
-- KEYS[8] -> rtq:{<queue>}:slots
-- KEYS[9] -> rtq:{<queue>}:running
-- KEYS[10] -> rtq:{<queue>}:began
-- ARGV[1] -> worker id holding the leases
-- ARGV[2] -> wake channel
-- ARGV[3..] -> task ids
--
-- Returns: the number of tasks requeued.
local t = {
  active = KEYS[1], owner = KEYS[2], unstarted = KEYS[7], slots = KEYS[8], running = KEYS[9], began = KEYS[10],
}
local state, priority, pending, seq = KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local worker, channel = ARGV[1], ARGV[2]

local before = claimable_count(pending)
local moved = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('HGET', t.owner, id) == worker then
    leave_active(t, id)
    push_pending(pending, seq, priority, state, id, true)
    moved = moved + 1
  end
end
wake(pending, channel, before)
wake_freed(t, pending, channel)
return moved
