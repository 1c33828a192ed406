-- Enqueue tasks into one queue: write their columns, put each in pending or scheduled.
-- All or nothing: if any id is taken or any uniqueness lock is held (by an earlier task or
-- by another task of this call), nothing is written.
--
-- KEYS[1] -> rtq:{<queue>}:msg
-- KEYS[2] -> rtq:{<queue>}:state
-- KEYS[3] -> rtq:{<queue>}:priority
-- KEYS[4] -> rtq:{<queue>}:pending
-- KEYS[5] -> rtq:{<queue>}:scheduled
-- KEYS[6] -> rtq:{<queue>}:seq
-- KEYS[7] -> rtq:{<queue>}:active
-- KEYS[8] -> rtq:{<queue>}:owner
-- KEYS[9] -> rtq:{<queue>}:idle
-- KEYS[10] -> rtq:{<queue>}:paused
-- KEYS[11] -> rtq:{<queue>}:runs
-- KEYS[12] -> rtq:{<queue>}:holds
-- KEYS[13] -> rtq:{<queue>}:lanes
-- KEYS[14] -> rtq:{<queue>}:vclock
-- KEYS[15..] -> rtq:{<queue>}:unique:<key>, one per task that has a unique key, and
--              rtq:{<queue>}:debounce:<key>, one per debounced task
-- ARGV[1] -> now (ms; 0 = the server's clock)
-- ARGV[2] -> wake channel
-- ARGV[3] -> hand-off channel prefix: a worker's channel is this followed by its id ("" = hand
--            nothing to idle workers)
-- ARGV[4] -> lease (ms) of a task handed to a worker
-- ARGV[5..] -> six per task: id, message JSON, priority, process-at (ms; 0 = now),
--              index of its unique key in KEYS (0 = none), unique lock TTL (ms; 0 = none);
--              for a debounced task, minus the index of its debounce key, and its window (ms)
--
-- Returns: {0, ...} when written, followed by two items per debounced task merged into a waiting
-- copy (add_debounced): its position i and that copy's id; {1, i} when task i's id exists;
-- {2, i} when task i's lock is held.
local q = enqueue_context(KEYS[11], KEYS[12], KEYS[13], KEYS[14])
local FIRST, FIELDS = 5, 6

local seen, locked = {}, {}
for i = FIRST, #ARGV, FIELDS do
  local n = (i - FIRST) / FIELDS + 1
  local id = ARGV[i]
  if seen[id] or redis.call('HEXISTS', q.state, id) == 1 then return {1, n} end
  seen[id] = true
  local unique_index = tonumber(ARGV[i + 4])
  if unique_index > 0 then  -- (a debounced task, index < 0, is never refused)
    local lock = KEYS[unique_index]
    if locked[lock] or redis.call('EXISTS', lock) == 1 then return {2, n} end
    locked[lock] = true
  end
end

local pending_before = claimable_count(q.pending)
q.pending_size = pending_before
local reply = {0}
for i = FIRST, #ARGV, FIELDS do
  local unique_index = tonumber(ARGV[i + 4])
  if unique_index < 0 then
    local into = add_debounced(q, ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), KEYS[-unique_index], tonumber(ARGV[i + 5]))
    if into then
      reply[#reply + 1] = (i - FIRST) / FIELDS + 1
      reply[#reply + 1] = into
    end
  else
    local lock = nil
    if unique_index > 0 then lock = KEYS[unique_index] end
    add_task(q, ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]), lock, tonumber(ARGV[i + 5]))
  end
end
wake(q.pending, q.channel, pending_before, q.pending_size)
return reply
