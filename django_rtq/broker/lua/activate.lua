-- Apply an activation in its target queue: enqueue a workflow's children that are tasks and
-- create those that are workflows (a workflow's own first activations are commands written
-- here). Applied once: a second application of the same command id changes nothing, and a
-- task or workflow whose id exists is left alone.
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
-- KEYS[11] -> rtq:{<queue>}:applied
-- KEYS[12] -> rtq:{<queue>}:waiting
-- KEYS[13] -> rtq:{<queue>}:commands
-- KEYS[14] -> rtq:{<queue>}:command
-- KEYS[15] -> rtq:{<queue>}:runs
-- KEYS[16] -> rtq:{<queue>}:holds
-- KEYS[17] -> rtq:{<queue>}:lanes
-- KEYS[18] -> rtq:{<queue>}:vclock
-- KEYS[19..] -> rtq:{<queue>}:wf:<id>, one per workflow created
-- ARGV[1] -> now (ms)
-- ARGV[2] -> wake channel
-- ARGV[3] -> hand-off channel prefix ("" = hand nothing to idle workers)
-- ARGV[4] -> lease (ms) of a task handed to a worker
-- ARGV[5] -> command id ("" for a workflow enqueued by a client: its id dedupes it)
-- ARGV[6] -> how long (ms) to remember applied commands
-- ARGV[7] -> JSON {"tasks": [[id, message JSON, priority, process-at ms], ...],
--            "workflows": [{"id", "msg", "key": index in KEYS, "fields": [name, value, ...],
--                           "commands": [[command id, command JSON(, due ms)], ...]}, ...]}
--            (a postponed workflow's one command, its start, is due at its start time)
--
-- Returns: the number of tasks and workflows written (0 for a command applied before).
local q = enqueue_context(KEYS[15], KEYS[16], KEYS[17], KEYS[18])
local applied, waiting, commands, command = KEYS[11], KEYS[12], KEYS[13], KEYS[14]
if not first_application(applied, ARGV[5], q.now, tonumber(ARGV[6])) then return 0 end
local plan = cjson.decode(ARGV[7])

local written = 0
local pending_before = claimable_count(q.pending)
for _, t in ipairs(plan.tasks or {}) do
  if redis.call('HEXISTS', q.state, t[1]) == 0 then
    add_task(q, t[1], t[2], tonumber(t[3]), tonumber(t[4]), nil, 0)
    written = written + 1
  end
end
for _, wf in ipairs(plan.workflows or {}) do
  if redis.call('HEXISTS', q.state, wf.id) == 0 then
    redis.call('HSET', q.msg, wf.id, wf.msg)
    redis.call('HSET', q.state, wf.id, 'waiting')
    redis.call('ZADD', waiting, q.now, wf.id)
    local key, fields = KEYS[wf.key], wf.fields
    for i = 1, #fields, 1000 do
      redis.call('HSET', key, unpack(fields, i, math.min(i + 999, #fields)))
    end
    for _, c in ipairs(wf.commands) do write_command(commands, command, c[1], c[2], tonumber(c[3]) or q.now) end
    written = written + 1
  end
end
wake(q.pending, q.channel, pending_before)
return written
