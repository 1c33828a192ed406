-- Take a batch of finished tasks' records to write to the ORM mirror. One worker at a time
-- mirrors a queue: the caller takes (or renews) the queue's mirror lock, or gets nothing
-- while another worker holds it. Records stay in the buffer until ack_finished.lua.
--
-- KEYS[1] -> rtq:{<queue>}:mirror_lock
-- KEYS[2] -> rtq:{<queue>}:finished
-- ARGV[1] -> worker id
-- ARGV[2] -> lock time to live (ms)
-- ARGV[3] -> largest batch
--
-- Returns: false when another worker holds the lock; else a flat list of id, record JSON.
local lock, finished = KEYS[1], KEYS[2]
local worker, ttl, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])

local holder = redis.call('GET', lock)
if holder and holder ~= worker then return false end
redis.call('SET', lock, worker, 'PX', ttl)
return redis.call('HRANDFIELD', finished, limit, 'WITHVALUES')
