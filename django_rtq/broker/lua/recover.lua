-- Take back tasks whose lease expired (their worker died, or lost Redis for longer than a
-- lease) and give them to another worker. A crash is not the task's failure: no attempt is
-- charged. A task that never started goes back to the front of pending uncounted; one whose
-- handler had started is counted as recovered, and archived as a poison pill (WorkerLost)
-- once it has been recovered more than `max_recoveries` times. A task that is given back
-- unstarted more than UNSTARTED_FACTOR times that budget is archived too: its start may have
-- killed its worker before it could be recorded.
--
-- KEYS[1] -> rtq:{<queue>}:active
-- KEYS[2] -> rtq:{<queue>}:owner
-- KEYS[3] -> rtq:{<queue>}:state
-- KEYS[4] -> rtq:{<queue>}:info
-- KEYS[5] -> rtq:{<queue>}:msg
-- KEYS[6] -> rtq:{<queue>}:pending
-- KEYS[7] -> rtq:{<queue>}:seq
-- KEYS[8] -> rtq:{<queue>}:priority
-- KEYS[9] -> rtq:{<queue>}:runs
-- KEYS[10] -> rtq:{<queue>}:unstarted
-- KEYS[11] -> rtq:{<queue>}:archived
-- KEYS[12] -> rtq:{<queue>}:finished
-- KEYS[13] -> rtq:{<queue>}:progress
-- KEYS[14] -> rtq:{<queue>}:commands
-- KEYS[15] -> rtq:{<queue>}:command
-- KEYS[16] -> rtq:{<queue>}:slots
-- KEYS[17] -> rtq:{<queue>}:running
-- KEYS[18] -> rtq:{<queue>}:began
-- KEYS[19..] -> rtq:{<queue>}:unique:<key>, one per task that has a unique key
-- ARGV[1] -> now (ms; 0 = the server's clock)
-- ARGV[2] -> grace (ms): how long past its expiry a lease must be to be taken back
-- ARGV[3] -> max recoveries of a task that had started
-- ARGV[4] -> 1 to keep an archived task's record for the ORM mirror, 0 not to
-- ARGV[5] -> wake channel
-- ARGV[6..] -> two per task: id, index of its unique key in KEYS (0 = none)
--
-- Returns: a flat list of id, outcome per task taken back: 'requeued' (had not started),
-- 'recovered' (had started; back in pending) or 'archived' (out of recoveries). Tasks whose
-- lease is still valid are left alone and not listed.
local UNSTARTED_FACTOR = 10
local now = clock_now(ARGV[1])
local t = {
  active = KEYS[1], owner = KEYS[2], state = KEYS[3], info = KEYS[4], msg = KEYS[5],
  runs = KEYS[9], unstarted = KEYS[10], archived = KEYS[11], finished = KEYS[12],
  progress = KEYS[13], commands = KEYS[14], command = KEYS[15], slots = KEYS[16], running = KEYS[17],
  began = KEYS[18], now = now, mirror = ARGV[4] == '1',
}
local pending, seq, priority = KEYS[6], KEYS[7], KEYS[8]
local cutoff, max_recoveries, channel = now - tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[5]

local before = claimable_count(pending)
local reply = {}
for i = 6, #ARGV, 2 do
  local id, unique_index = ARGV[i], tonumber(ARGV[i + 1])
  local lease = tonumber(redis.call('ZSCORE', t.active, id))
  if lease and lease < cutoff then
    local worker = redis.call('HGET', t.owner, id) or '?'
    local started = redis.call('SISMEMBER', t.unstarted, id) == 0
    leave_active(t, id)
    local ok, facts = pcall(cjson.decode, redis.call('HGET', t.info, id) or '{}')
    if not ok or type(facts) ~= 'table' then facts = {} end
    local field, budget = 'requeued', max_recoveries * UNSTARTED_FACTOR
    if started then field, budget = 'recovered', max_recoveries end
    facts[field] = (tonumber(facts[field]) or 0) + 1
    if facts[field] > budget then
      local error = {
        type = 'django_rtq.exceptions.WorkerLost',
        message = 'its worker died (last ' .. worker .. ') ' .. facts[field] .. ' times while it ' ..
          (started and 'ran' or 'was about to run') .. '; archived as a poison pill',
        traceback = '',
      }
      facts.error_type, facts.error, facts.traceback = error.type, error.message, ''
      facts.failed_at = now / 1000
      if type(facts.errors) ~= 'table' then facts.errors = {} end
      table.insert(facts.errors, error)
      local lock = nil
      if unique_index > 0 then lock = KEYS[unique_index] end
      archive_task(t, id, cjson.encode(facts), lock)
      reply[#reply + 1] = id
      reply[#reply + 1] = 'archived'
    else
      redis.call('HSET', t.info, id, cjson.encode(facts))
      push_pending(pending, seq, priority, t.state, id, true)
      reply[#reply + 1] = id
      reply[#reply + 1] = started and 'recovered' or 'requeued'
    end
  end
end
wake(pending, channel, before)
wake_freed(t, pending, channel)
return reply
