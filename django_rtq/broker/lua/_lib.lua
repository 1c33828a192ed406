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
