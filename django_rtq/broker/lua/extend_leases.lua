#!lua flags=allow-oom
-- Extend the leases a worker holds on its active tasks, and record which of them have started
-- since they were claimed into the worker's memory (see claim.lua), and when the run of each
-- started one began: "<run>:<ms>" in `began`, written once per run, so that the start a reader
-- sees does not move with the lease. It is the start of the lease this extension renews: the
-- claim's (or hand-off's) for a task started at once, the previous extension's for one that
-- waited in the worker's memory, the same time a reader takes before it is written (the
-- lease's expiry less the lease). A run's entry goes as its task leaves active (leave_active
-- in _lib.lua, complete.lua); one of an older run is never read as this run's.
--
-- Allowed on a full Redis (maxmemory with noeviction: flag allow-oom): it moves the scores of
-- members that exist (ZADD XX) and removes members, which needs no memory, and notes a run's
-- start once (a few bytes a run over the limit); a worker whose renewals were refused would stop
-- its handlers when Redis is merely full.
--
-- KEYS[1] -> rtq:{<queue>}:active
-- KEYS[2] -> rtq:{<queue>}:owner
-- KEYS[3] -> rtq:{<queue>}:unstarted
-- KEYS[4] -> rtq:{<queue>}:runs
-- KEYS[5] -> rtq:{<queue>}:began
-- ARGV[1] -> now (ms; 0 = the server's clock)
-- ARGV[2] -> lease (ms)
-- ARGV[3] -> worker id
-- ARGV[4..] -> two per task: id, 1 if its handler has started (0 if it still waits)
--
-- Returns: the number of leases extended (tasks the worker no longer holds are skipped).
local active, owner, unstarted, runs, began = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local lease, worker = tonumber(ARGV[2]), ARGV[3]
local expiry = clock_now(ARGV[1]) + lease

-- Note when this run of a started task began (its lease's start, `score` less the lease),
-- unless it is noted already.
local function note_began(id, score)
  local run = redis.call('HGET', runs, id)
  if not run or not score then return end
  local noted = redis.call('HGET', began, id)
  if noted and string.sub(noted, 1, #run + 1) == run .. ':' then return end
  redis.call('HSET', began, id, run .. ':' .. string.format('%d', score - lease))
end

local extended = 0
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', owner, id) == worker then
    local score = tonumber(redis.call('ZSCORE', active, id))
    redis.call('ZADD', active, 'XX', expiry, id)
    if ARGV[i + 1] == '1' then
      redis.call('SREM', unstarted, id)
      note_began(id, score)
    end
    extended = extended + 1
  end
end
return extended
