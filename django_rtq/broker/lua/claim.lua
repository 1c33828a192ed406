-- Claim up to `limit` pending tasks, highest priority first: move them to active under a
-- lease held by the worker, and return their messages and attempt facts. A worker that finds
-- fewer than it asked for is registered as idle, so that the next task enqueued to an empty
-- queue is handed straight to it (see enqueue.lua); one that finds enough is not.
--
-- KEYS[1] -> rtq:{<queue>}:pending
-- KEYS[2] -> rtq:{<queue>}:active
-- KEYS[3] -> rtq:{<queue>}:state
-- KEYS[4] -> rtq:{<queue>}:owner
-- KEYS[5] -> rtq:{<queue>}:msg
-- KEYS[6] -> rtq:{<queue>}:info
-- KEYS[7] -> rtq:{<queue>}:paused
-- KEYS[8] -> rtq:{<queue>}:idle
-- ARGV[1] -> lease expiry (ms)
-- ARGV[2] -> worker id
-- ARGV[3] -> limit
-- ARGV[4] -> idle registration expiry (ms); 0 = do not register
--
-- Returns: a flat list of id, message JSON, info JSON per claimed task (false where missing);
-- empty when the queue is paused or has nothing pending.
local pending, active, state, owner, msg, info, paused, idle =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local expiry, worker, limit, idle_until = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

redis.call('ZREM', idle, worker)
if redis.call('EXISTS', paused) == 1 then return {} end
local popped = redis.call('ZPOPMIN', pending, limit)
local reply = {}
for i = 1, #popped, 2 do
  local id = popped[i]
  redis.call('ZADD', active, expiry, id)
  redis.call('HSET', state, id, 'active')
  redis.call('HSET', owner, id, worker)
  reply[#reply + 1] = id
  reply[#reply + 1] = redis.call('HGET', msg, id)
  reply[#reply + 1] = redis.call('HGET', info, id)
end
if #popped / 2 < limit and idle_until > 0 then
  redis.call('ZADD', idle, idle_until, worker)
end
return reply
