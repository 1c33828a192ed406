-- Helpers shared by the scripts; the loader puts this file in front of each of them.

-- A pending task's score: its priority band, then FIFO order within the band.
-- (100 - priority) * 10^13 + seq stays an exact integer in a double for any seq < 10^13.
local PRIORITY_BAND = 10000000000000

local function push_pending(pending, seq, priority_hash, state_hash, id, front)
  local priority = tonumber(redis.call('HGET', priority_hash, id) or '0')
  local order = 0
  if not front then order = redis.call('INCR', seq) end
  redis.call('ZADD', pending, (100 - priority) * PRIORITY_BAND + order, id)
  redis.call('HSET', state_hash, id, 'pending')
end

-- Tell idle workers when pending goes from empty to non-empty.
local function wake(pending, channel, count_before)
  if count_before == 0 and redis.call('ZCARD', pending) > 0 then
    redis.call('PUBLISH', channel, '1')
  end
end

-- Release a uniqueness lock, but only the one held by this task.
local function release_unique(unique_key, id)
  if unique_key and redis.call('GET', unique_key) == id then
    redis.call('DEL', unique_key)
  end
end

local function bump_counter(key, ttl)
  redis.call('INCR', key)
  redis.call('EXPIRE', key, ttl)
end

-- Write a command for a worker to apply to another slot (see django_rtq/workflows/commands.py).
local function write_command(commands, command, cmd_id, json, due)
  redis.call('HSET', command, cmd_id, json)
  redis.call('ZADD', commands, due, cmd_id)
end

-- Tell a workflow that its child (a decoded message) failed for good, given the child's info.
local function notify_failure(commands, command, id, message, info_json, now)
  if type(message) ~= 'table' or type(message.parent) ~= 'string' then return end
  local ok, info = pcall(cjson.decode, info_json)
  if not ok or type(info) ~= 'table' then info = {} end
  write_command(commands, command, 'child:' .. id, cjson.encode({
    type = 'child', to = message.parent, to_queue = message.parent_queue, pos = message.position,
    child = id, ok = false,
    error = {type = info.error_type or '', message = info.error or '', traceback = info.traceback or ''},
  }), now)
end

-- Keep a finished task's record for the ORM mirror (see mirror_take.lua): the task's message,
-- its attempt facts and its result, as one JSON object, by task id.
local function buffer_finished(finished, id, status, now, message, info_json, result_json)
  redis.call('HSET', finished, id,
    '{"status":"' .. status .. '","finished_at":' .. now .. ',"msg":' .. (message or 'null') ..
    ',"info":' .. info_json .. ',"result":' .. (result_json or 'null') .. '}')
end

-- The keys and settings of a script that enqueues (enqueue, enqueue_periodic). Both take as
-- their first ten keys msg, state, priority, pending, scheduled, seq, active, owner, idle and
-- paused, and as their first four arguments now (ms), the wake channel, the hand-off channel
-- prefix and the lease (ms) of a handed-off task, in this order.
local function enqueue_context()
  return {
    msg = KEYS[1], state = KEYS[2], priority = KEYS[3], pending = KEYS[4], scheduled = KEYS[5],
    seq = KEYS[6], active = KEYS[7], owner = KEYS[8], idle = KEYS[9], paused = KEYS[10],
    now = tonumber(ARGV[1]), channel = ARGV[2], handoff_prefix = ARGV[3], lease = tonumber(ARGV[4]),
  }
end

-- Hand a task to an idle worker if one is listening; return whether it was. PUBLISH counts
-- the clients it reached: a registered worker that is not listening (it lost its connection,
-- or, on a cluster, listens through another node) is dropped from the idle set instead.
local function hand_off(q, id, body)
  if redis.call('ZCARD', q.idle) == 0 or redis.call('ZCARD', q.pending) > 0
      or redis.call('EXISTS', q.paused) == 1 then
    return false
  end
  redis.call('ZREMRANGEBYSCORE', q.idle, '-inf', q.now)
  for _, worker in ipairs(redis.call('ZRANGE', q.idle, 0, -1)) do
    redis.call('ZREM', q.idle, worker)
    if redis.call('PUBLISH', q.handoff_prefix .. worker, id .. '\n' .. body) > 0 then
      redis.call('ZADD', q.active, q.now + q.lease, id)
      redis.call('HSET', q.state, id, 'active')
      redis.call('HSET', q.owner, id, worker)
      return true
    end
  end
  return false
end

-- Write a new task (its id and lock already checked as free): its columns and uniqueness
-- lock (`lock` a key or nil; `lock_ttl` ms, 0 = none), then scheduled, an idle worker or pending.
-- The caller calls wake() once it has added its tasks.
local function add_task(q, id, body, priority, process_at, lock, lock_ttl)
  redis.call('HSET', q.msg, id, body)
  if priority ~= 0 then redis.call('HSET', q.priority, id, priority) end
  if lock then
    if lock_ttl > 0 then
      redis.call('SET', lock, id, 'PX', lock_ttl)
    else
      redis.call('SET', lock, id)
    end
  end
  if process_at > q.now then
    redis.call('ZADD', q.scheduled, process_at, id)
    redis.call('HSET', q.state, id, 'scheduled')
  elseif not hand_off(q, id, body) then
    push_pending(q.pending, q.seq, q.priority, q.state, id, false)
  end
end

-- Workflows (django_rtq/workflows). A workflow is a task of its queue in the `waiting` state
-- with a hash of its own (w.wf: kind, counters, children's specs) and its children's results
-- (w.results), both deleted when it finishes. `w` holds the keys and now of the calling script.

-- The command telling a workflow's own workflow (if it has one) how it ended; "" if none.
local function parent_notice(w, ok)
  local parent = redis.call('HMGET', w.wf, 'parent', 'parent_queue', 'position')
  if not parent[1] or parent[1] == '' then return nil end
  return cjson.encode({type = 'child', to = parent[1], to_queue = parent[2],
    pos = tonumber(parent[3]) or parent[3], child = w.id, ok = ok})
end

local function workflow_info(w, extra)
  local created = tonumber(redis.call('HGET', w.wf, 'created') or w.now)
  return '{"started_at":' .. (created / 1000) .. ',"attempted_at":' .. (created / 1000) .. extra .. '}'
end

local function drop_workflow_columns(w)
  redis.call('ZREM', w.waiting, w.id)
  redis.call('DEL', w.wf, w.results)
end

-- The workflow succeeded with `result_json`.
local function finish_workflow(w, result_json)
  local notice = parent_notice(w, true)
  if notice then
    write_command(w.commands, w.command, 'child:' .. w.id,
      string.sub(notice, 1, -2) .. ',"result":' .. result_json .. '}', w.now)
  end
  local retention = tonumber(redis.call('HGET', w.wf, 'retention') or '0')
  local info_json = workflow_info(w, ',"finished_at":' .. (w.now / 1000))
  if w.mirror then
    buffer_finished(w.finished, w.id, 'succeeded', w.now, redis.call('HGET', w.msg, w.id), info_json, result_json)
  end
  drop_workflow_columns(w)
  if retention > 0 then
    redis.call('HSET', w.state, w.id, 'completed')
    redis.call('HSET', w.info, w.id, info_json)
    redis.call('HSET', w.result, w.id, result_json)
    redis.call('ZADD', w.completed, w.now + retention, w.id)
  else
    redis.call('HDEL', w.state, w.id)
    redis.call('HDEL', w.msg, w.id)
    redis.call('HDEL', w.info, w.id)
  end
end

-- The workflow failed (a child failed for good, or it was cancelled): archive it, cancel its
-- children that have not finished (a command to their queues), tell its own workflow.
local function fail_workflow(w, error_type, error_message, child)
  local info_json = workflow_info(w, ',"failed_at":' .. (w.now / 1000) .. ',"error_type":' ..
    cjson.encode(error_type) .. ',"error":' .. cjson.encode(error_message) ..
    ',"failed_child":' .. cjson.encode(child or ''))
  local by_queue, any = {}, false
  local fields = redis.call('HGETALL', w.wf)
  for i = 1, #fields, 2 do
    local pos = string.match(fields[i], '^queue:(.+)$')
    if pos then
      local queue = fields[i + 1]
      by_queue[queue] = by_queue[queue] or {}
      table.insert(by_queue[queue], w.id .. '.' .. pos)
      any = true
    end
  end
  if any then
    write_command(w.commands, w.command, 'cancel:' .. w.id,
      cjson.encode({type = 'cancel', workflow = w.id, children = by_queue}), w.now)
  end
  local notice = parent_notice(w, false)
  if notice then
    local decoded = cjson.decode(notice)
    decoded.error = {type = error_type, message = error_message, traceback = ''}
    write_command(w.commands, w.command, 'child:' .. w.id, cjson.encode(decoded), w.now)
  end
  if w.mirror then
    buffer_finished(w.finished, w.id, 'failed', w.now, redis.call('HGET', w.msg, w.id), info_json)
  end
  drop_workflow_columns(w)
  redis.call('HSET', w.state, w.id, 'archived')
  redis.call('HSET', w.info, w.id, info_json)
  redis.call('ZADD', w.archived, w.now, w.id)
end

-- Has this command been applied in this slot? If not, record that it now is (and forget
-- records older than `ttl` ms: by then its source has long removed the command).
local function first_application(applied, cmd_id, now, ttl)
  if cmd_id == '' then return true end
  if redis.call('ZSCORE', applied, cmd_id) then return false end
  redis.call('ZREMRANGEBYSCORE', applied, '-inf', now - ttl)
  redis.call('ZADD', applied, now, cmd_id)
  return true
end
