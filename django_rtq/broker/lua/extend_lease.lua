-- Extend the leases a worker holds on its active tasks.
--
-- KEYS[1] -> rtq:{<queue>}:active
-- KEYS[2] -> rtq:{<queue>}:owner
-- ARGV[1] -> new lease expiry (ms)
-- ARGV[2] -> worker id
-- ARGV[3..] -> task ids
--
-- Returns: the number of leases extended (tasks the worker no longer holds are skipped).
local active, owner = KEYS[1], KEYS[2]
local expiry, worker = ARGV[1], ARGV[2]

local extended = 0
for i = 3, #ARGV do
  if redis.call('HGET', owner, ARGV[i]) == worker then
    redis.call('ZADD', active, 'XX', expiry, ARGV[i])
    extended = extended + 1
  end
end
return extended
