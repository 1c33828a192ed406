-- Start a postponed workflow once its time has come, applying its start command (written by
-- activate.lua, due then), once: its stage goes from `postponed` to its first one (mapping for
-- a map/reduce; none for a workflow without stages), and its first activation commands, kept
-- in its hash (`start`) until now, are written to apply.
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
-- ARGV[3] -> 1 to keep records for the ORM mirror, 0 not to
-- ARGV[4] -> command id
-- ARGV[5] -> how long (ms) to remember applied commands
--
-- Returns: 1 when started; 0 when applied before, or when the workflow is no longer postponed
-- (it was cancelled or deleted meanwhile); {"corrupt", the error} when its own state is
-- corrupt (its stage or its first activations are not what a postponed workflow holds): it
-- is then archived with that error, as a failed one (fail_workflow in _lib.lua); the error
-- reply "NEWERFORMAT ..." (nothing changed) when its hash is of a newer format.
local w = workflow_context()

if redis.call('HGET', w.state, w.id) ~= 'waiting' then return 0 end
local newer = refuse_newer_workflow(w)
if newer then return newer end
if not first_application(w.applied, ARGV[4], w.now, tonumber(ARGV[5])) then return 0 end
local defect = workflow_keys_defect(w)
if defect then return fail_corrupt_workflow(w, defect) end
local stage, start = unpack(redis.call('HMGET', w.wf, 'stage', 'start'))
-- Started before: its stage moved on and its start went.
if stage ~= 'postponed' and not start then return 0 end
defect = field_defect('stage', stage or nil, {expected = "'postponed'", test = function(v) return v == 'postponed' end})
  or field_defect('start', start or nil, WF_CHECK.text)
local decoded, commands = pcall(cjson.decode, start or '')
if not defect then
  local good = decoded and type(commands) == 'table' and #commands > 0
  for _, c in ipairs(good and commands or {}) do
    good = good and type(c) == 'table' and type(c[1]) == 'string' and type(c[2]) == 'string'
  end
  if not good then defect = "field 'start' is " .. shown(start) .. ', not a JSON list of commands' end
end
if defect then return fail_corrupt_workflow(w, defect) end
local first_stage = redis.call('HGET', w.wf, 'stage:0')
if first_stage then
  redis.call('HSET', w.wf, 'stage', first_stage)
else
  redis.call('HDEL', w.wf, 'stage')
end
for _, c in ipairs(commands) do
  write_command(w.commands, w.command, c[1], c[2], w.now)
end
redis.call('HDEL', w.wf, 'start')
return 1
