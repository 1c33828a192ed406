-- Claim up to `limit` pending tasks, highest priority first: move them to active under a
-- lease held by the worker, and return their messages and attempt facts.
--
-- KEYS[1] -> rtq:{<queue>}:pending
-- KEYS[2] -> rtq:{<queue>}:active
-- KEYS[3] -> rtq:{<queue>}:state
-- KEYS[4] -> rtq:{<queue>}:owner
-- KEYS[5] -> rtq:{<queue>}:msg
-- KEYS[6] -> rtq:{<queue>}:info
-- KEYS[7] -> rtq:{<queue>}:paused
-- ARGV[1] -> lease expiry (ms)
-- ARGV[2] -> worker id
-- ARGV[3] -> limit
--
-- Returns: a flat list of id, message JSON, info JSON per claimed task (false where missing);
-- empty when the queue is paused or has nothing pending.
local pending, active, state, owner, msg, info, paused = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local expiry, worker, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])

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
return reply
