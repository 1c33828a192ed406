-- Tidy the parked index of the kinds given: drop entries whose task is no longer parked (run,
-- archived or deleted since), up to a budget, and forget each kind that has no entry left.
--
-- KEYS[1] -> rtq:{<queue>}:pending
-- KEYS[2] -> rtq:{<queue>}:parked
-- KEYS[3] -> rtq:{<queue>}:parked_kinds
-- ARGV[1] -> entries looked at per kind, at most
-- ARGV[2..] -> kinds
--
-- Returns: the number of entries dropped.
local pending, parked, kinds = KEYS[1], KEYS[2], KEYS[3]
local budget = tonumber(ARGV[1])
local dropped = 0
for i = 2, #ARGV do
  local kind = ARGV[i]
  local entries = redis.call('ZRANGEBYLEX', parked, '[' .. kind .. '\0', '(' .. kind .. '\1', 'LIMIT', 0, budget)
  for _, entry in ipairs(entries) do
    local score, id = string.match(string.sub(entry, #kind + 2), '^(%d+)%z(.+)$')
    if not score or tonumber(redis.call('ZSCORE', pending, id)) ~= PARKED_BASE + tonumber(score) then
      redis.call('ZREM', parked, entry)
      dropped = dropped + 1
    end
  end
  if redis.call('ZLEXCOUNT', parked, '[' .. kind .. '\0', '(' .. kind .. '\1') == 0 then
    redis.call('HDEL', kinds, kind)
  end
end
return dropped
