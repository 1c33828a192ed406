-- Claim up to `limit` pending tasks, highest priority first: move them to active under a
-- lease held by the worker, and return their messages, attempt facts and run numbers. The
-- first `start_now` go straight to free threads; the others wait in the worker's memory and
-- are marked unstarted until the worker reports their start (extend_lease), so that a task
-- recovered from a dead worker is known to have never run. A worker that finds fewer than it
-- asked for is registered as idle, so that the next task enqueued to an empty queue is handed
-- straight to it (see enqueue.lua); one that finds enough is not.
--
-- KEYS[1] -> rtq:{<queue>}:pending
-- KEYS[2] -> rtq:{<queue>}:active
-- KEYS[3] -> rtq:{<queue>}:state
-- KEYS[4] -> rtq:{<queue>}:owner
-- KEYS[5] -> rtq:{<queue>}:msg
-- KEYS[6] -> rtq:{<queue>}:info
-- KEYS[7] -> rtq:{<queue>}:paused
-- KEYS[8] -> rtq:{<queue>}:idle
-- KEYS[9] -> rtq:{<queue>}:runs
-- KEYS[10] -> rtq:{<queue>}:unstarted
-- ARGV[1] -> now (ms; 0 = the server's clock)
-- ARGV[2] -> lease (ms)
-- ARGV[3] -> worker id
-- ARGV[4] -> limit
-- ARGV[5] -> how many of the claimed tasks start at once (the rest are marked unstarted)
-- ARGV[6] -> how long (ms) to stay registered as idle; 0 = do not register
--
-- Returns: a flat list of id, message JSON, info JSON, run number per claimed task (false
-- where missing); empty when the queue is paused or has nothing pending.
local pending, active, state, owner, msg, info, paused, idle, runs, unstarted =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local now, lease, worker = clock_now(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local limit, start_now, idle_for = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])

redis.call('ZREM', idle, worker)
if redis.call('EXISTS', paused) == 1 then return {} end
local popped = redis.call('ZPOPMIN', pending, limit)
local ids, leases, states, owners = {}, {}, {}, {}
for i = 1, #popped, 2 do
  local id, n = popped[i], #ids
  ids[n + 1] = id
  leases[2 * n + 1], leases[2 * n + 2] = now + lease, id
  states[2 * n + 1], states[2 * n + 2] = id, 'active'
  owners[2 * n + 1], owners[2 * n + 2] = id, worker
end
local reply = {}
if #ids > 0 then
  -- One command per column for the whole batch: far cheaper than one per task.
  call_for_all('ZADD', active, leases)
  call_for_all('HSET', state, states)
  call_for_all('HSET', owner, owners)
  local waiting = {}
  for k = start_now + 1, #ids do waiting[#waiting + 1] = ids[k] end
  if #waiting > 0 then call_for_all('SADD', unstarted, waiting) end
  local messages, infos = call_for_all('HMGET', msg, ids), call_for_all('HMGET', info, ids)
  for k, id in ipairs(ids) do
    reply[#reply + 1] = id
    reply[#reply + 1] = messages[k]
    reply[#reply + 1] = infos[k]
    reply[#reply + 1] = redis.call('HINCRBY', runs, id, 1)
  end
end
if #ids < limit and idle_for > 0 then
  redis.call('ZADD', idle, now + idle_for, worker)
end
return reply
