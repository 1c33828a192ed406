-- Enqueue the task of one tick of a periodic schedule, unless that tick (or a later one) was
-- already dealt with: the schedule's last tick is kept in the queue's periodic hash and moved
-- in the same step, so however many schedulers call this for a tick, one task is enqueued.
-- A schedule seen for the first time is only armed: its tick is recorded, nothing enqueued.
-- A tick whose task id exists, or whose uniqueness lock is held, is recorded and skipped.
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
-- KEYS[11] -> rtq:{<queue>}:periodic
-- KEYS[12] -> rtq:{<queue>}:runs
-- KEYS[13] -> rtq:{<queue>}:holds
-- KEYS[14] -> rtq:{<queue>}:lanes
-- KEYS[15] -> rtq:{<queue>}:vclock
-- KEYS[16..] -> rtq:{<queue>}:unique:<key>, when the task has a unique key
-- ARGV[1] -> now (ms; 0 = the server's clock)
-- ARGV[2] -> wake channel
-- ARGV[3] -> hand-off channel prefix: a worker's channel is this followed by its id ("" = hand
--            nothing to idle workers)
-- ARGV[4] -> lease (ms) of a task handed to a worker
-- ARGV[5] -> schedule name
-- ARGV[6] -> tick (ms)
-- ARGV[7] -> task id
-- ARGV[8] -> message JSON
-- ARGV[9] -> priority
-- ARGV[10] -> unique lock TTL (ms; 0 = none)
--
-- Returns: 0 when the tick was already dealt with; 1 when enqueued; 2 when armed (first
-- sight of the schedule); 3 when the task id exists; 4 when the uniqueness lock is held.
local q = enqueue_context(KEYS[12], KEYS[13], KEYS[14], KEYS[15])
local periodic = KEYS[11]
local lock = KEYS[16]
local name, tick, id, body = ARGV[5], tonumber(ARGV[6]), ARGV[7], ARGV[8]
local priority, lock_ttl = tonumber(ARGV[9]), tonumber(ARGV[10])

local last = redis.call('HGET', periodic, name)
if last and tonumber(last) >= tick then return 0 end
redis.call('HSET', periodic, name, tick)
if not last then return 2 end
if redis.call('HEXISTS', q.state, id) == 1 then return 3 end
if lock and redis.call('EXISTS', lock) == 1 then return 4 end

local pending_before = claimable_count(q.pending)
add_task(q, id, body, priority, 0, lock, lock_ttl)
wake(q.pending, q.channel, pending_before)
return 1
