#!lua flags=allow-oom
-- Extend the leases a worker holds on its active tasks, and record which of them have started
-- since they were claimed into the worker's memory (see claim.lua).
--
-- Allowed on a full Redis (maxmemory with noeviction: flag allow-oom): it only moves the scores
-- of members that exist (ZADD XX) and removes members, so it needs no memory, and a worker whose
-- renewals were refused would stop its handlers when Redis is merely full.
--
-- KEYS[1] -> rtq:{<queue>}:active
-- KEYS[2] -> rtq:{<queue>}:owner
-- KEYS[3] -> rtq:{<queue>}:unstarted
-- ARGV[1] -> now (ms; 0 = the server's clock)
-- ARGV[2] -> lease (ms)
-- ARGV[3] -> worker id
-- ARGV[4..] -> two per task: id, 1 if its handler has started (0 if it still waits)
--
-- Returns: the number of leases extended (tasks the worker no longer holds are skipped).
local active, owner, unstarted = KEYS[1], KEYS[2], KEYS[3]
local expiry, worker = clock_now(ARGV[1]) + tonumber(ARGV[2]), ARGV[3]

local extended = 0
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', owner, id) == worker then
    redis.call('ZADD', active, 'XX', expiry, id)
    if ARGV[i + 1] == '1' then redis.call('SREM', unstarted, id) end
    extended = extended + 1
  end
end
return extended
