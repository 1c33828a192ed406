-- Leave claimed tasks that this worker's release cannot run for a worker that can (the worker
-- tells why, as each one's kind: broker/waiting.py): out of active, uncounted, and parked in
-- pending (park_task). Each only while this run still holds it (owner and run number); others
-- are skipped. Idle workers are woken, so that one able to run them claims them.
--
-- KEYS[1] -> rtq:{<queue>}:active
-- KEYS[2] -> rtq:{<queue>}:owner
-- KEYS[3] -> rtq:{<queue>}:unstarted
-- KEYS[4] -> rtq:{<queue>}:slots
-- KEYS[5] -> rtq:{<queue>}:running
-- KEYS[6] -> rtq:{<queue>}:runs
-- KEYS[7] -> rtq:{<queue>}:state
-- KEYS[8] -> rtq:{<queue>}:priority
-- KEYS[9] -> rtq:{<queue>}:seq
-- KEYS[10] -> rtq:{<queue>}:pending
-- KEYS[11] -> rtq:{<queue>}:parked
-- KEYS[12] -> rtq:{<queue>}:parked_kinds
-- KEYS[13] -> rtq:{<queue>}:began
-- ARGV[1] -> now (ms; 0 = the server's clock)
-- ARGV[2] -> worker id holding the leases
-- ARGV[3] -> wake channel
-- ARGV[4..] -> four per task: id, run number, kind, reason
--
-- Returns: the number of tasks parked.
local t = {
  active = KEYS[1], owner = KEYS[2], unstarted = KEYS[3], slots = KEYS[4], running = KEYS[5], began = KEYS[13],
}
local runs, state, priority, seq = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local p = {pending = KEYS[10], state = state, parked = KEYS[11], kinds = KEYS[12]}
local now, worker, channel = clock_now(ARGV[1]), ARGV[2], ARGV[3]

local parked = 0
for i = 4, #ARGV, 4 do
  local id, run, kind, reason = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if redis.call('HGET', t.owner, id) == worker and redis.call('HGET', runs, id) == run
      and redis.call('HGET', state, id) == 'active' then
    leave_active(t, id)
    local band = 100 - tonumber(redis.call('HGET', priority, id) or '0')
    park_task(p, kind, band * PRIORITY_BAND + redis.call('INCR', seq), id, now, reason)
    parked = parked + 1
  end
end
if parked > 0 then redis.call('PUBLISH', channel, '1') end
wake_freed(t, p.pending, channel)
return parked
