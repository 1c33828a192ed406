-- Settle a failed attempt: move the task to retry (to run again later) or to archived, where
-- its record is kept for the ORM mirror when mirroring and its workflow is told.
-- Results are fenced by run (see take_for_settling in _lib.lua): a failure that comes late,
-- after a newer run of the task started, is left out.
--
-- KEYS[1] -> rtq:{<queue>}:active
-- KEYS[2] -> rtq:{<queue>}:owner
-- KEYS[3] -> rtq:{<queue>}:state
-- KEYS[4] -> rtq:{<queue>}:info
-- KEYS[5] -> rtq:{<queue>}:retry
-- KEYS[6] -> rtq:{<queue>}:archived
-- KEYS[7] -> rtq:{<queue>}:processed:<day>
-- KEYS[8] -> rtq:{<queue>}:failed:<day>
-- KEYS[9] -> rtq:{<queue>}:msg
-- KEYS[10] -> rtq:{<queue>}:finished
-- KEYS[11] -> rtq:{<queue>}:progress
-- KEYS[12] -> rtq:{<queue>}:commands
-- KEYS[13] -> rtq:{<queue>}:command
-- KEYS[14] -> rtq:{<queue>}:runs
-- KEYS[15] -> rtq:{<queue>}:unstarted
-- KEYS[16] -> rtq:{<queue>}:pending
-- KEYS[17] -> rtq:{<queue>}:slots
-- KEYS[18] -> rtq:{<queue>}:running
-- KEYS[19] -> rtq:{<queue>}:began
-- KEYS[20..] -> rtq:{<queue>}:unique:<key>, at most one: the task's uniqueness lock when it
--               has one (released when archived)
-- ARGV[1] -> task id
-- ARGV[2] -> worker id that ran it
-- ARGV[3] -> run number (from its claim)
-- ARGV[4] -> target state: 'retry' or 'archived'
-- ARGV[5] -> score: next attempt (ms) for retry, now (ms) for archived
-- ARGV[6] -> info JSON
-- ARGV[7] -> counter TTL (s)
-- ARGV[8] -> 1 to keep an archived task's record for the ORM mirror, 0 not to
-- ARGV[9] -> wake channel (published to when a freed concurrency slot may let a task start)
--
-- Returns: 1 when moved; 0 when the result came late.
local id, worker, run, target, score, info_json, counter_ttl =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6], ARGV[7]
local t = {
  active = KEYS[1], owner = KEYS[2], state = KEYS[3], info = KEYS[4], retry = KEYS[5],
  archived = KEYS[6], msg = KEYS[9], finished = KEYS[10], progress = KEYS[11], commands = KEYS[12],
  command = KEYS[13], runs = KEYS[14], unstarted = KEYS[15], pending = KEYS[16],
  slots = KEYS[17], running = KEYS[18], began = KEYS[19], now = score, mirror = ARGV[8] == '1',
}

if not take_for_settling(t, id, worker, run) then return 0 end
if target == 'retry' then
  redis.call('HSET', t.info, id, info_json)
  redis.call('HSET', t.state, id, 'retry')
  redis.call('ZADD', t.retry, score, id)
else
  archive_task(t, id, info_json, KEYS[20])
end
bump_counter(KEYS[7], counter_ttl)
bump_counter(KEYS[8], counter_ttl)
wake_freed(t, t.pending, ARGV[9])
return 1
