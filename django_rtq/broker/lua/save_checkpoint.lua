-- Save a running task's checkpoint in its info (the `checkpoint` fact: the value's JSON text,
-- kept as text so that no round trip through Lua changes it; `checkpointed_at`: when, epoch
-- seconds), raising the info's format version "v" to one that holds a checkpoint. Fenced by run:
-- only the run that holds the task (active, owned by `worker`, its run number the claim's) may
-- write, so a run that lost its lease cannot overwrite the checkpoint of a newer one. The other
-- facts are kept as they are (decoded and re-encoded, as recover.lua does).
--
-- KEYS[1] -> rtq:{<queue>}:active
-- KEYS[2] -> rtq:{<queue>}:owner
-- KEYS[3] -> rtq:{<queue>}:runs
-- KEYS[4] -> rtq:{<queue>}:info
-- ARGV[1] -> now (ms; 0 = the server's clock)
-- ARGV[2] -> task id
-- ARGV[3] -> worker id
-- ARGV[4] -> run number (from its claim)
-- ARGV[5] -> the checkpoint's JSON text
-- ARGV[6] -> the info format version that holds a checkpoint
--
-- Returns: the time (ms) the checkpoint was saved at; 0 when this run no longer holds the task.
local active, owner, runs, info = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, worker, run, version = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[6])
if redis.call('HGET', runs, id) ~= run or redis.call('HGET', owner, id) ~= worker
    or not redis.call('ZSCORE', active, id) then
  return 0
end
local now = clock_now(ARGV[1])
local ok, facts = pcall(cjson.decode, redis.call('HGET', info, id) or '{}')
if not ok or type(facts) ~= 'table' then facts = {} end
if type(facts.v) ~= 'number' or facts.v < version then facts.v = version end
facts.checkpoint = ARGV[5]
facts.checkpointed_at = now / 1000
redis.call('HSET', info, id, cjson.encode(facts))
return now
