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
-- KEYS[7..] -> rtq:{<queue>}:unique:<key>, one per task that has a unique key
-- ARGV[1] -> now (ms)
-- ARGV[2] -> wake channel
-- ARGV[3..] -> six per task: id, message JSON, priority, process-at (ms; 0 = now),
--              index of its unique key in KEYS (0 = none), unique lock TTL (ms; 0 = none)
--
-- Returns: {0} when written; {1, i} when task i's id exists; {2, i} when task i's lock is held.
local msg, state, priority_hash, pending, scheduled, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now = tonumber(ARGV[1])
local channel = ARGV[2]
local FIELDS = 6

local seen, locked = {}, {}
for i = 3, #ARGV, FIELDS do
  local n = (i - 3) / FIELDS + 1
  local id = ARGV[i]
  if seen[id] or redis.call('HEXISTS', state, id) == 1 then return {1, n} end
  seen[id] = true
  local unique_index = tonumber(ARGV[i + 4])
  if unique_index > 0 then
    local lock = KEYS[unique_index]
    if locked[lock] or redis.call('EXISTS', lock) == 1 then return {2, n} end
    locked[lock] = true
  end
end

local pending_before = redis.call('ZCARD', pending)
for i = 3, #ARGV, FIELDS do
  local id, body, priority = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local process_at, unique_index = tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
  redis.call('HSET', msg, id, body)
  if priority ~= 0 then redis.call('HSET', priority_hash, id, priority) end
  if unique_index > 0 then
    local ttl = tonumber(ARGV[i + 5])
    if ttl > 0 then
      redis.call('SET', KEYS[unique_index], id, 'PX', ttl)
    else
      redis.call('SET', KEYS[unique_index], id)
    end
  end
  if process_at > now then
    redis.call('ZADD', scheduled, process_at, id)
    redis.call('HSET', state, id, 'scheduled')
  else
    push_pending(pending, seq, priority_hash, state, id, false)
  end
end
wake(pending, channel, pending_before)
return {0}
