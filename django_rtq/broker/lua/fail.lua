-- Settle a failed attempt: move an active task to retry (to run again later) or to archived;
-- an archived task's record is kept for the ORM mirror when mirroring.
-- Used by the worker that holds the task, and by the recoverer for a task whose lease
-- expired; the latter passes a cutoff so that a lease renewed meanwhile is left alone.
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
-- KEYS[14..] -> rtq:{<queue>}:unique:<key>, at most one: the task's uniqueness lock when it
--               has one (released when archived)
-- ARGV[1] -> task id
-- ARGV[2] -> worker id holding the lease
-- ARGV[3] -> lease cutoff (ms): the lease must have expired before it; 0 = no such check
-- ARGV[4] -> target state: 'retry' or 'archived'
-- ARGV[5] -> score: next attempt (ms) for retry, now (ms) for archived
-- ARGV[6] -> info JSON
-- ARGV[7] -> counter TTL (s)
-- ARGV[8] -> 1 to keep an archived task's record for the ORM mirror, 0 not to
--
-- An archived task that is a workflow's child tells its workflow (a command).
--
-- Returns: 1 when moved; 0 when the worker does not hold the task or its lease is still valid.
local active, owner, state, info, retry, archived, processed, failed, msg, finished =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local id, worker, cutoff, target, score, info_json, counter_ttl, mirror =
  ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8] == "1"

if redis.call('HGET', owner, id) ~= worker then return 0 end
if cutoff > 0 then
  local lease = redis.call('ZSCORE', active, id)
  if not lease or tonumber(lease) >= cutoff then return 0 end
end
redis.call('ZREM', active, id)
redis.call('HDEL', owner, id)
redis.call('HSET', info, id, info_json)
redis.call('HSET', state, id, target)
if target == 'retry' then
  redis.call('ZADD', retry, score, id)
else
  redis.call('ZADD', archived, score, id)
  redis.call('HDEL', KEYS[11], id)
  release_unique(KEYS[14], id)
  local message = redis.call('HGET', msg, id)
  local ok, decoded = false, nil
  if message then ok, decoded = pcall(cjson.decode, message) end
  if mirror then
    -- A corrupt payload is archived too; keep it as a JSON string so the record stays JSON.
    if message and not ok then message = cjson.encode(message) end
    buffer_finished(finished, id, 'failed', score, message, info_json)
  end
  if ok then notify_failure(KEYS[12], KEYS[13], id, decoded, info_json, tonumber(score)) end
end
bump_counter(processed, counter_ttl)
bump_counter(failed, counter_ttl)
return 1
