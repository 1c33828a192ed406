-- Return active tasks to the front of pending without counting an attempt (a worker shutting
-- down, or giving back tasks it claimed but will not run).
--
-- KEYS[1] -> rtq:{<queue>}:active
-- KEYS[2] -> rtq:{<queue>}:owner
-- KEYS[3] -> rtq:{<queue>}:state
-- KEYS[4] -> rtq:{<queue>}:priority
-- KEYS[5] -> rtq:{<queue>}:pending
-- KEYS[6] -> rtq:{<queue>}:seq
-- ARGV[1] -> worker id holding the leases
-- ARGV[2] -> wake channel
-- ARGV[3..] -> task ids
--
-- Returns: the number of tasks requeued.
local active, owner, state, priority, pending, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local worker, channel = ARGV[1], ARGV[2]

local before = redis.call('ZCARD', pending)
local moved = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('HGET', owner, id) == worker then
    redis.call('ZREM', active, id)
    redis.call('HDEL', owner, id)
    push_pending(pending, seq, priority, state, id, true)
    moved = moved + 1
  end
end
wake(pending, channel, before)
return moved
