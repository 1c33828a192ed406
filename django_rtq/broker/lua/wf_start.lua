-- Start a postponed workflow once its time has come, applying its start command (written by
-- wf_activate, due then), once: its stage goes from `postponed` to its first one (mapping for
-- a map/reduce; none for a workflow without stages), and its first activation commands, kept
-- in its hash (`start`) until now, are written to apply.
--
-- KEYS[1] -> rtq:{<queue>}:wf:<workflow id>
-- KEYS[2] -> rtq:{<queue>}:applied
-- KEYS[3] -> rtq:{<queue>}:commands
-- KEYS[4] -> rtq:{<queue>}:command
-- KEYS[5] -> rtq:{<queue>}:state
-- ARGV[1] -> now (ms)
-- ARGV[2] -> workflow id
-- ARGV[3] -> command id
-- ARGV[4] -> how long (ms) to remember applied commands
--
-- Returns: 1 when started; 0 when applied before, or when the workflow is no longer postponed
-- (it was cancelled or deleted meanwhile).
local wf, applied, commands, command, state = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now, id = tonumber(ARGV[1]), ARGV[2]

if not first_application(applied, ARGV[3], now, tonumber(ARGV[4])) then return 0 end
if redis.call('HGET', state, id) ~= 'waiting' or redis.call('HGET', wf, 'stage') ~= 'postponed' then
  return 0
end
local first_stage = redis.call('HGET', wf, 'stage:0')
if first_stage then
  redis.call('HSET', wf, 'stage', first_stage)
else
  redis.call('HDEL', wf, 'stage')
end
for _, c in ipairs(cjson.decode(redis.call('HGET', wf, 'start') or '[]')) do
  write_command(commands, command, c[1], c[2], now)
end
redis.call('HDEL', wf, 'start')
return 1
