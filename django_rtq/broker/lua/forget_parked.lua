-- Tidy a queue's parked tasks (the janitor, each pass): drop the index's entries whose task is
-- no longer parked (run, archived or deleted since), up to a budget a kind; forget each kind
-- left without one; and note a kind the index holds but `parked_kinds` lost (its tasks would
-- wait unseen), as waiting from now.
--
-- KEYS[1] -> rtq:{<queue>}:pending
-- KEYS[2] -> rtq:{<queue>}:parked
-- KEYS[3] -> rtq:{<queue>}:parked_kinds
-- ARGV[1] -> entries looked at per kind, at most
-- ARGV[2] -> now (ms)
--
-- Returns: the number of entries dropped.
local pending, parked, kinds = KEYS[1], KEYS[2], KEYS[3]
local budget, now = tonumber(ARGV[1]), tonumber(ARGV[2])
-- Kinds of the index looked at for a lost entry of parked_kinds, at most.
local HEADS_LIMIT = 100

local function range(kind) return '[' .. kind .. '\0', '(' .. kind .. '\1' end

local dropped = 0
for _, kind in ipairs(redis.call('HKEYS', kinds)) do
  local from, to = range(kind)
  for _, entry in ipairs(redis.call('ZRANGEBYLEX', parked, from, to, 'LIMIT', 0, budget)) do
    local score, id = string.match(string.sub(entry, #kind + 2), '^(%d+)%z(.+)$')
    if not score or tonumber(redis.call('ZSCORE', pending, id)) ~= PARKED_BASE + tonumber(score) then
      redis.call('ZREM', parked, entry)
      dropped = dropped + 1
    end
  end
  if redis.call('ZLEXCOUNT', parked, from, to) == 0 then redis.call('HDEL', kinds, kind) end
end

local from = '-'
for _ = 1, HEADS_LIMIT do
  local head = redis.call('ZRANGEBYLEX', parked, from, '+', 'LIMIT', 0, 1)[1]
  if not head then break end
  local kind = string.match(head, '^(.-)%z')
  if not kind then
    redis.call('ZREM', parked, head)
  else
    if redis.call('HEXISTS', kinds, kind) == 0 then
      local task = string.match(kind, '^(.-)\1') or kind
      redis.call('HSET', kinds, kind, cjson.encode({since = now,
        reason = "waiting for a worker that can run task type '" .. task .. "'"}))
    end
    from = '[' .. kind .. '\1'
  end
end
return dropped
