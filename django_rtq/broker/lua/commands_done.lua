-- Remove applied commands, each only if unchanged since it was taken (a command rewritten
-- meanwhile, say by a child that was run again, stays for its own application).
--
-- KEYS[1] -> rtq:{<queue>}:commands
-- KEYS[2] -> rtq:{<queue>}:command
-- ARGV[1..] -> two per command: id, SHA-1 of the JSON that was applied
--
-- Returns: the number of commands removed.
local commands, command = KEYS[1], KEYS[2]
local removed = 0
for i = 1, #ARGV, 2 do
  local body = redis.call('HGET', command, ARGV[i])
  if body and redis.sha1hex(body) == ARGV[i + 1] then
    redis.call('HDEL', command, ARGV[i])
    redis.call('ZREM', commands, ARGV[i])
    removed = removed + 1
  end
end
return removed
