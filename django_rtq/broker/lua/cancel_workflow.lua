-- Cancel a waiting workflow (postponed or started): archive it as cancelled, cancel its
-- children that have not started (a command to their queues), and tell its own workflow
-- (fail_workflow in _lib.lua).
--
-- KEYS[1] -> rtq:{<queue>}:wf:<workflow id>
-- KEYS[2] -> rtq:{<queue>}:wf:<workflow id>:results
-- KEYS[3] -> rtq:{<queue>}:applied
-- KEYS[4] -> rtq:{<queue>}:commands
-- KEYS[5] -> rtq:{<queue>}:command
-- KEYS[6] -> rtq:{<queue>}:msg
-- KEYS[7] -> rtq:{<queue>}:state
-- KEYS[8] -> rtq:{<queue>}:waiting
-- KEYS[9] -> rtq:{<queue>}:completed
-- KEYS[10] -> rtq:{<queue>}:archived
-- KEYS[11] -> rtq:{<queue>}:info
-- KEYS[12] -> rtq:{<queue>}:result
-- KEYS[13] -> rtq:{<queue>}:finished
-- KEYS[14] -> rtq:{<queue>}:priority
-- KEYS[15] -> rtq:{<queue>}:progress
-- KEYS[16] -> rtq:{<queue>}:runs
-- ARGV[1] -> now (ms)
-- ARGV[2] -> workflow id
-- ARGV[3] -> 1 to keep its record for the ORM mirror, 0 not to
-- ARGV[4] -> error type
-- ARGV[5] -> error message
--
-- Returns: 1 when cancelled; 0 when it is not a waiting workflow; the error reply
-- "NEWERFORMAT ..." (nothing changed) when its hash is of a newer format (refuse_newer_workflow).
local w = workflow_context()
if redis.call('HGET', w.state, w.id) ~= 'waiting' then return 0 end
local newer = refuse_newer_workflow(w)
if newer then return newer end
fail_workflow(w, ARGV[4], ARGV[5], nil)
return 1
