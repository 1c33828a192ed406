-- Move tasks whose time has come from scheduled (or retry) to pending, at most `limit`.
--
-- KEYS[1] -> rtq:{<queue>}:scheduled or rtq:{<queue>}:retry
-- KEYS[2] -> rtq:{<queue>}:state
-- KEYS[3] -> rtq:{<queue>}:priority
-- KEYS[4] -> rtq:{<queue>}:pending
-- KEYS[5] -> rtq:{<queue>}:seq
-- KEYS[6] -> rtq:{<queue>}:msg
-- KEYS[7] -> rtq:{<queue>}:lanes
-- KEYS[8] -> rtq:{<queue>}:vclock
-- ARGV[1] -> now (ms; 0 = the server's clock)
-- ARGV[2] -> limit
-- ARGV[3] -> wake channel
--
-- Returns: the number of tasks moved; the caller calls again until it gets 0.
local source, state, priority, pending, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now, limit, channel = clock_now(ARGV[1]), ARGV[2], ARGV[3]

local due = redis.call('ZRANGE', source, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
if #due == 0 then return 0 end
local before = claimable_count(pending)
-- A queue that has had partitioned tasks places each at its partition's turn (push_pending).
local f = nil
if redis.call('EXISTS', KEYS[8]) == 1 then
  f = {pending = pending, seq = seq, msg = KEYS[6], lanes = KEYS[7], vclock = KEYS[8]}
end
for _, id in ipairs(due) do
  redis.call('ZREM', source, id)
  push_pending(pending, seq, priority, state, id, false, nil, f)
end
wake(pending, channel, before)
return #due
