-- Helpers shared by the scripts; the loader puts this file in front of each of them.

-- A pending task's score: its priority band, then FIFO order within the band.
-- (100 - priority) * 10^13 + seq stays an exact integer in a double for any seq < 10^13.
local PRIORITY_BAND = 10000000000000

local function push_pending(pending, seq, priority_hash, state_hash, id, front)
  local priority = tonumber(redis.call('HGET', priority_hash, id) or '0')
  local order = 0
  if not front then order = redis.call('INCR', seq) end
  redis.call('ZADD', pending, (100 - priority) * PRIORITY_BAND + order, id)
  redis.call('HSET', state_hash, id, 'pending')
end

-- Tell idle workers when pending goes from empty to non-empty.
local function wake(pending, channel, count_before)
  if count_before == 0 and redis.call('ZCARD', pending) > 0 then
    redis.call('PUBLISH', channel, '1')
  end
end

-- Release a uniqueness lock, but only the one held by this task.
local function release_unique(unique_key, id)
  if unique_key and redis.call('GET', unique_key) == id then
    redis.call('DEL', unique_key)
  end
end

local function bump_counter(key, ttl)
  redis.call('INCR', key)
  redis.call('EXPIRE', key, ttl)
end

-- Keep a finished task's record for the ORM mirror (see mirror_take.lua): the task's message,
-- its attempt facts and its result, as one JSON object, by task id.
local function buffer_finished(finished, id, status, now, message, info_json, result_json)
  redis.call('HSET', finished, id,
    '{"status":"' .. status .. '","finished_at":' .. now .. ',"msg":' .. (message or 'null') ..
    ',"info":' .. info_json .. ',"result":' .. (result_json or 'null') .. '}')
end

-- The keys and settings of a script that enqueues (enqueue, enqueue_periodic). Both take as
-- their first ten keys msg, state, priority, pending, scheduled, seq, active, owner, idle and
-- paused, and as their first four arguments now (ms), the wake channel, the hand-off channel
-- prefix and the lease (ms) of a handed-off task, in this order.
local function enqueue_context()
  return {
    msg = KEYS[1], state = KEYS[2], priority = KEYS[3], pending = KEYS[4], scheduled = KEYS[5],
    seq = KEYS[6], active = KEYS[7], owner = KEYS[8], idle = KEYS[9], paused = KEYS[10],
    now = tonumber(ARGV[1]), channel = ARGV[2], handoff_prefix = ARGV[3], lease = tonumber(ARGV[4]),
  }
end

-- Hand a task to an idle worker if one is listening; return whether it was. PUBLISH counts
-- the clients it reached: a registered worker that is not listening (it lost its connection,
-- or, on a cluster, listens through another node) is dropped from the idle set instead.
local function hand_off(q, id, body)
  if redis.call('ZCARD', q.idle) == 0 or redis.call('ZCARD', q.pending) > 0
      or redis.call('EXISTS', q.paused) == 1 then
    return false
  end
  redis.call('ZREMRANGEBYSCORE', q.idle, '-inf', q.now)
  for _, worker in ipairs(redis.call('ZRANGE', q.idle, 0, -1)) do
    redis.call('ZREM', q.idle, worker)
    if redis.call('PUBLISH', q.handoff_prefix .. worker, id .. '\n' .. body) > 0 then
      redis.call('ZADD', q.active, q.now + q.lease, id)
      redis.call('HSET', q.state, id, 'active')
      redis.call('HSET', q.owner, id, worker)
      return true
    end
  end
  return false
end

-- Write a new task (its id and lock already checked as free): its columns and uniqueness
-- lock (`lock` a key or nil; `lock_ttl` ms, 0 = none), then scheduled, an idle worker or pending.
-- The caller calls wake() once it has added its tasks.
local function add_task(q, id, body, priority, process_at, lock, lock_ttl)
  redis.call('HSET', q.msg, id, body)
  if priority ~= 0 then redis.call('HSET', q.priority, id, priority) end
  if lock then
    if lock_ttl > 0 then
      redis.call('SET', lock, id, 'PX', lock_ttl)
    else
      redis.call('SET', lock, id)
    end
  end
  if process_at > q.now then
    redis.call('ZADD', q.scheduled, process_at, id)
    redis.call('HSET', q.state, id, 'scheduled')
  elseif not hand_off(q, id, body) then
    push_pending(q.pending, q.seq, q.priority, q.state, id, false)
  end
end
