-- Send tasks from the transactional outbox into one queue. Unlike enqueue, each task stands
-- alone, for a row may be sent more than once (its sender died before deleting it, say): a task
-- whose id exists, or that the outbox sent before (its id is in `outboxed`), is not written
-- again; one whose uniqueness lock is held is dropped, as an enqueue would refuse it. Every task
-- is then in `outboxed`, so that a later send of its row is a no-op even once the task has
-- finished and left the queue; the relay forgets the ids whose rows are gone.
--
-- KEYS[1] -> rtq:{<queue>}:msg
-- KEYS[2] -> rtq:{<queue>}:state
-- KEYS[3] -> rtq:{<queue>}:priority
-- KEYS[4] -> rtq:{<queue>}:pending
-- KEYS[5] -> rtq:{<queue>}:scheduled
-- KEYS[6] -> rtq:{<queue>}:seq
-- KEYS[7] -> rtq:{<queue>}:active
-- KEYS[8] -> rtq:{<queue>}:owner
-- KEYS[9] -> rtq:{<queue>}:idle
-- KEYS[10] -> rtq:{<queue>}:paused
-- KEYS[11] -> rtq:{<queue>}:runs
-- KEYS[12] -> rtq:{<queue>}:holds
-- KEYS[13] -> rtq:{<queue>}:lanes
-- KEYS[14] -> rtq:{<queue>}:vclock
-- KEYS[15] -> rtq:{<queue>}:outboxed
-- KEYS[16..] -> rtq:{<queue>}:unique:<key>, one per task that has a unique key, and
--              rtq:{<queue>}:debounce:<key>, one per debounced task
-- ARGV[1] -> now (ms; 0 = the server's clock)
-- ARGV[2] -> wake channel
-- ARGV[3] -> hand-off channel prefix ("" = hand nothing to idle workers)
-- ARGV[4] -> lease (ms) of a task handed to a worker
-- ARGV[5..] -> six per task, as enqueue.lua takes them
--
-- Returns one code per task: 0 written (a debounced task: added, or merged into the copy that
-- waits, as enqueue.lua does); 1 sent before (its id exists, or is in `outboxed`);
-- 2 dropped (its uniqueness lock is held).
local q = enqueue_context(KEYS[11], KEYS[12], KEYS[13], KEYS[14])
local outboxed = KEYS[15]
local FIRST, FIELDS = 5, 6
local kind = redis.call('TYPE', outboxed)['ok']
if kind ~= 'zset' and kind ~= 'none' then
  return redis.error_reply('outbox: key ' .. outboxed .. ' is a ' .. kind .. ', not a sorted set')
end

local pending_before = claimable_count(q.pending)
q.pending_size = pending_before
local codes, seen = {}, {}
for i = FIRST, #ARGV, FIELDS do
  local id = ARGV[i]
  local code = 0
  if seen[id] or redis.call('ZSCORE', outboxed, id) or redis.call('HEXISTS', q.state, id) == 1 then
    code = 1
  end
  local unique_index = tonumber(ARGV[i + 4])
  local lock = nil
  if unique_index > 0 then lock = KEYS[unique_index] end
  -- A lock of its own is from a send of this row that failed half-way: not a duplicate.
  if code == 0 and lock then
    local holder = redis.call('GET', lock)
    if holder and holder ~= id then code = 2 end
  end
  if code == 0 and unique_index < 0 then
    add_debounced(q, id, ARGV[i + 1], tonumber(ARGV[i + 2]), KEYS[-unique_index], tonumber(ARGV[i + 5]))
  elseif code == 0 then
    add_task(q, id, ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]), lock, tonumber(ARGV[i + 5]))
  end
  if not seen[id] then redis.call('ZADD', outboxed, 'NX', q.now, id) end
  seen[id] = true
  codes[#codes + 1] = code
end
wake(q.pending, q.channel, pending_before, q.pending_size)
return codes
