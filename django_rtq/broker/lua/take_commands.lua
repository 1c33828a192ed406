-- Take due commands of a queue to apply: each is leased (due again after the lease) so that a
-- worker that dies while applying it leaves it for another; commands_done.lua removes it.
--
-- KEYS[1] -> rtq:{<queue>}:commands
-- KEYS[2] -> rtq:{<queue>}:command
-- ARGV[1] -> now (ms)
-- ARGV[2] -> lease (ms)
-- ARGV[3] -> largest number of commands
--
-- Returns: a flat list of command id, command JSON.
local commands, command = KEYS[1], KEYS[2]
local now, lease, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

local taken = {}
for _, cmd_id in ipairs(redis.call('ZRANGE', commands, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)) do
  local body = redis.call('HGET', command, cmd_id)
  if body then
    redis.call('ZADD', commands, now + lease, cmd_id)
    table.insert(taken, cmd_id)
    table.insert(taken, body)
  else
    redis.call('ZREM', commands, cmd_id)
  end
end
return taken
