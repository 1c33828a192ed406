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
-- KEYS[11..] -> rtq:{<queue>}:unique:<key>, one per task that has a unique key
-- ARGV[1] -> now (ms)
-- ARGV[2] -> wake channel
-- ARGV[3] -> hand-off channel prefix: a worker's channel is this followed by its id
-- ARGV[4] -> lease (ms) of a task handed to a worker
-- ARGV[5..] -> six per task: id, message JSON, priority, process-at (ms; 0 = now),
--              index of its unique key in KEYS (0 = none), unique lock TTL (ms; 0 = none)
--
-- Returns: {0} when written; {1, i} when task i's id exists; {2, i} when task i's lock is held.
local msg, state, priority_hash, pending, scheduled, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local active, owner, idle, paused = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local now, channel, handoff_prefix, lease = tonumber(ARGV[1]), ARGV[2], ARGV[3], tonumber(ARGV[4])
local FIRST, FIELDS = 5, 6

-- Hand a task to an idle worker if one is listening; return whether it was. PUBLISH counts
-- the clients it reached: a registered worker that is not listening (it lost its connection,
-- or, on a cluster, listens through another node) is dropped from the idle set instead.
local function hand_off(id, body)
  if redis.call('ZCARD', idle) == 0 or redis.call('ZCARD', pending) > 0
      or redis.call('EXISTS', paused) == 1 then
    return false
  end
  redis.call('ZREMRANGEBYSCORE', idle, '-inf', now)
  for _, worker in ipairs(redis.call('ZRANGE', idle, 0, -1)) do
    redis.call('ZREM', idle, worker)
    if redis.call('PUBLISH', handoff_prefix .. worker, id .. '\n' .. body) > 0 then
      redis.call('ZADD', active, now + lease, id)
      redis.call('HSET', state, id, 'active')
      redis.call('HSET', owner, id, worker)
      return true
    end
  end
  return false
end

local seen, locked = {}, {}
for i = FIRST, #ARGV, FIELDS do
  local n = (i - FIRST) / FIELDS + 1
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
for i = FIRST, #ARGV, FIELDS do
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
  elseif not hand_off(id, body) then
    push_pending(pending, seq, priority_hash, state, id, false)
  end
end
wake(pending, channel, pending_before)
return {0}
