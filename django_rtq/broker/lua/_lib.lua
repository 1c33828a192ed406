-- Helpers shared by the scripts; the loader puts this file in front of each of them.

-- The time (ms) a script works with: the server's own clock (TIME) when the caller passes 0, so
-- that leases mean the same on every host whatever their clocks say; a test's clock otherwise.
local function clock_now(arg)
  local now = tonumber(arg) or 0
  if now > 0 then return now end
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- Arguments one command takes at most from a list (Lua's unpack is bounded by its C stack).
local UNPACK_LIMIT = 1000

-- Call a command once per UNPACK_LIMIT items of `items`, each call taking `key` and that slice;
-- return the replies joined (for a command that answers with one reply per item, like HMGET).
local function call_for_all(command, key, items)
  local replies = {}
  for i = 1, #items, UNPACK_LIMIT do
    local reply = redis.call(command, key, unpack(items, i, math.min(i + UNPACK_LIMIT - 1, #items)))
    if type(reply) == 'table' then
      for _, value in ipairs(reply) do replies[#replies + 1] = value end
    end
  end
  return replies
end

-- A pending task's score: its priority band, then FIFO order within the band.
-- (100 - priority) * 10^13 + seq stays an exact integer in a double for any seq < 10^13.
local PRIORITY_BAND = 10000000000000

-- Flow control (broker/limits.py). A pending task that its type's limits hold back stays in
-- pending with HELD_BASE added to its score, after every task that can run, and is indexed in
-- the queue's `held` set (all scores 0) as "<task>\0<its score>\0<id>": by type, then in its
-- pending order. A claim releases it (release_held) once its type's limits allow a start. The
-- same as HELD_BASE in broker/limits.py (a test checks).
local HELD_BASE = 4000000000000000
local HELD_BASE_TEXT = '4000000000000000'

-- Fair partitions (docs/partitions.md): start-time fair queuing within pending's order. A task
-- given a partition does not take the next place of `seq` but its partition's next turn: past
-- the later of the partition's last turn (`lanes`: partition -> its last turn) and the queue's
-- virtual clock (`vclock`: the furthest place a claim has taken a task from), by 1/weight. A
-- partition's backlog is so spread over the turns to come, and a partition that comes later
-- starts at the clock, beside it; the tasks without a partition are one more lane (`seq`, which
-- claims keep at the clock or past it: advance_vclock). `f`: pending, seq, msg, lanes, vclock.

-- The partition of a stored message and its weight (nil, 1 for none). TaskMessage.to_json
-- writes them right after "task" and "v"; a name with an escape in it is decoded.
local function partition_of(body)
  if not body or not string.find(body, '^{"task":"[^"\\]*","v":%d+,"partition":"') then return nil, 1 end
  local name, after = string.match(body, '^{"task":"[^"\\]*","v":%d+,"partition":"([^"\\]*)"()')
  local weight = nil
  if name then
    weight = string.match(body, '^,"partition_weight":(%d+)', after)
  else
    local ok, decoded = pcall(cjson.decode, body)
    if not (ok and type(decoded) == 'table' and type(decoded.partition) == 'string') then return nil, 1 end
    name, weight = decoded.partition, decoded.partition_weight
  end
  return name, math.max(1, math.min(100, math.floor(tonumber(weight) or 1)))
end

-- How many tasks at the head of pending vclock_of looks past for one with a place: those given
-- back to the front (place 0) by a stopping worker or a recovery.
local VCLOCK_HEAD_SCAN = 1000

-- The queue's virtual clock, started (the first partitioned task of the queue) just before the
-- place of the first task at the head of pending that has one (the clock is a place claims took,
-- and that one's is not yet), or else at `seq`: the partition joins the queue where its claims are.
local function vclock_of(f)
  local clock = tonumber(redis.call('GET', f.vclock))
  if clock then return clock end
  clock = nil
  local head = redis.call(
    'ZRANGEBYSCORE', f.pending, '-inf', '(' .. HELD_BASE_TEXT, 'WITHSCORES', 'LIMIT', 0, VCLOCK_HEAD_SCAN
  )
  for i = 2, #head, 2 do
    local place = tonumber(head[i]) % PRIORITY_BAND
    if place > 0 then
      clock = place - 1
      break
    end
  end
  clock = clock or tonumber(redis.call('GET', f.seq)) or 0
  redis.call('SET', f.vclock, clock)
  return clock
end

-- A partitioned task's place in pending (within its priority band): its partition's next turn.
local function lane_place(f, partition, weight)
  local last = tonumber(redis.call('ZSCORE', f.lanes, partition)) or 0
  local turn = math.max(vclock_of(f), last) + 1 / weight
  redis.call('ZADD', f.lanes, turn, partition)
  return math.ceil(turn - 0.000001)
end

-- Put a task in pending, at the end of its priority band or (`front`) at its head; a task with a
-- partition at its partition's next turn, when the caller passes `f` (the body read from f.msg
-- unless given). `priority` is the task's when the caller knows it; nil reads it from priority_hash.
local function push_pending(pending, seq, priority_hash, state_hash, id, front, priority, f, body)
  priority = priority or tonumber(redis.call('HGET', priority_hash, id) or '0')
  local order = 0
  if not front then
    local partition, weight = nil, 1
    if f then partition, weight = partition_of(body or redis.call('HGET', f.msg, id)) end
    if partition then
      order = lane_place(f, partition, weight)
    else
      order = redis.call('INCR', seq)
    end
  end
  redis.call('ZADD', pending, (100 - priority) * PRIORITY_BAND + order, id)
  redis.call('HSET', state_hash, id, 'pending')
end

-- How many pending tasks a claim could take: those not held back.
local function claimable_count(pending)
  return redis.call('ZCOUNT', pending, '-inf', '(' .. HELD_BASE_TEXT)
end

-- Tasks no worker of some release can run (broker/waiting.py). A parked task stays in pending
-- with PARKED_BASE added to its score (after every task that can run, and every held one), is
-- indexed in the queue's `parked` set (all scores 0) as "<kind>\0<its score>\0<id>": by kind,
-- then in pending order; `parked_kinds` notes since when each kind waits, and why. A claim of a
-- worker that can run a kind takes its tasks from there. The same as PARKED_BASE in
-- broker/waiting.py (a test checks).
local PARKED_BASE = 6500000000000000

-- Park a pending task (already out of any other state set): p: pending, state, parked, kinds.
local function park_task(p, kind, score, id, now, reason)
  redis.call('ZADD', p.pending, PARKED_BASE + score, id)
  redis.call('HSET', p.state, id, 'pending')
  redis.call('ZADD', p.parked, 0, kind .. '\0' .. string.format('%017.0f', score) .. '\0' .. id)
  if redis.call('HEXISTS', p.kinds, kind) == 0 then
    redis.call('HSET', p.kinds, kind, cjson.encode({since = now, reason = reason}))
  end
end

-- Give back the concurrency slots (taken by claim.lua) of tasks leaving active, and note in
-- t.freed that a held task may start now. t: slots, running. Garbage in these keys (a wrong
-- type, a count that is not one) is passed over, never raised: the callers have already changed
-- the task's state when they get here.
local function release_slots(t, ids)
  if redis.call('TYPE', t.slots).ok ~= 'hash' then return end
  local counted = redis.call('TYPE', t.running).ok == 'hash'
  local scopes = call_for_all('HMGET', t.slots, ids)
  local holders = {}
  for k, joined in ipairs(scopes) do
    if joined then
      holders[#holders + 1] = ids[k]
      for scope in string.gmatch(joined, '[^\n]+') do
        local left = counted and (tonumber(redis.call('HGET', t.running, scope)) or 0) - 1 or 0
        if left > 0 then
          redis.call('HSET', t.running, scope, left)
        elseif counted then
          redis.call('HDEL', t.running, scope)
        end
      end
    end
  end
  if #holders > 0 then
    call_for_all('HDEL', t.slots, holders)
    t.freed = true
  end
end

-- After release_slots freed a slot: wake the idle workers if a task waits, held back or not.
local function wake_freed(t, pending, channel)
  if t.freed and redis.call('ZCARD', pending) > 0 then redis.call('PUBLISH', channel, '1') end
end

-- Take an active task out of its worker's hands: no lease, no owner, no mark of a start to come
-- nor of when its run began, no concurrency slot. t: active, owner, unstarted, began, slots, running.
local function leave_active(t, id)
  redis.call('ZREM', t.active, id)
  redis.call('HDEL', t.owner, id)
  redis.call('SREM', t.unstarted, id)
  redis.call('HDEL', t.began, id)
  release_slots(t, {id})
end

-- May this run of a task (`run`: the fencing token its claim returned) settle it? Yes while the
-- run still holds it (active, owned by `worker`), and also when it was given back (pending or
-- retry, after its lease expired during an outage) and nobody has run it since: the result of
-- the run is then applied after all. The task is taken out of its state set. No for a late
-- result: a newer run exists, or the task is gone. t: runs, state, active, owner, unstarted,
-- pending, retry.
local function take_for_settling(t, id, worker, run)
  if redis.call('HGET', t.runs, id) ~= run then return false end
  local state = redis.call('HGET', t.state, id)
  if state == 'active' then
    if redis.call('HGET', t.owner, id) ~= worker then return false end
    leave_active(t, id)
    return true
  elseif state == 'pending' then
    redis.call('ZREM', t.pending, id)
    return true
  elseif state == 'retry' then
    redis.call('ZREM', t.retry, id)
    return true
  end
  return false
end

-- Tell idle workers when pending goes from nothing to claim to something (claimable_count).
-- `count_after` is that count now when the caller knows it; nil reads it.
local function wake(pending, channel, count_before, count_after)
  if count_before == 0 and (count_after or claimable_count(pending)) > 0 then
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

-- Keep a finished task's record for the ORM mirror (see take_finished.lua): the task's message,
-- its attempt facts and its result, as one JSON object, by task id.
local function buffer_finished(finished, id, status, now, message, info_json, result_json)
  redis.call('HSET', finished, id,
    '{"status":"' .. status .. '","finished_at":' .. now .. ',"msg":' .. (message or 'null') ..
    ',"info":' .. info_json .. ',"result":' .. (result_json or 'null') .. '}')
end

-- Every way into `archived` or out of existence goes through drop_task and archive_task.
-- Their first argument `t` holds the calling script's keys and settings; each helper reads:
--   drop_task:    t.msg, t.state, t.info, t.result, t.priority, t.progress, t.runs
--   archive_task: t.msg, t.state, t.info, t.progress, t.archived, t.commands, t.command, t.now (ms),
--                 t.mirror (boolean) and, when t.mirror, t.finished

-- Remove every column of a task (msg, state, info, result, priority, progress, runs). Callers
-- ZREM it from its state set themselves.
local function drop_task(t, id)
  for _, column in ipairs({t.msg, t.state, t.info, t.result, t.priority, t.progress, t.runs}) do
    redis.call('HDEL', column, id)
  end
end

-- Archive a task already removed from its previous state set: write its info (`info_json`,
-- which carries the reason: error_type, error), state 'archived', ZADD archived at t.now, drop
-- its progress, release its uniqueness lock (`unique_key`: a key name or nil), buffer its
-- record for the mirror when t.mirror, and tell its workflow (a command) when it has one.
local function archive_task(t, id, info_json, unique_key)
  redis.call('HSET', t.info, id, info_json)
  redis.call('HSET', t.state, id, 'archived')
  redis.call('ZADD', t.archived, t.now, id)
  redis.call('HDEL', t.progress, id)
  release_unique(unique_key, id)
  local message = redis.call('HGET', t.msg, id)
  local ok, decoded = false, nil
  if message then ok, decoded = pcall(cjson.decode, message) end
  if t.mirror then
    -- A corrupt payload is archived too; keep it as a JSON string so the record stays JSON.
    if message and not ok then message = cjson.encode(message) end
    buffer_finished(t.finished, id, 'failed', t.now, message, info_json)
  end
  if ok then notify_failure(t.commands, t.command, id, decoded, info_json, t.now) end
end

-- A task's info (`info_raw`: its JSON, or nil) with the reason it was ended by hand: error_type,
-- error, no traceback, failed_at (s). What was there is kept (cjson writes numbers to 14
-- significant digits: epoch seconds to 0.1 ms); the errors of its attempts stay as they were.
local function info_with_reason(info_raw, error_type, error_message, now)
  local ok, info = pcall(cjson.decode, info_raw or '{}')
  if not ok or type(info) ~= 'table' then info = {} end
  info.error_type, info.error, info.traceback, info.failed_at = error_type, error_message, '', now / 1000
  return cjson.encode(info)
end

-- The keys and settings of a script that enqueues (enqueue, enqueue_periodic, activate). They
-- take as their first ten keys msg, state, priority, pending, scheduled, seq, active, owner, idle
-- and paused, and as their first four arguments now (ms; 0 = the server's clock), the wake
-- channel, the hand-off channel prefix and the lease (ms) of a handed-off task, in this order.
-- `runs` is the key of the queue's runs hash: a script that does not declare it hands nothing
-- to idle workers (they are woken and claim instead); nor does one given "" as the prefix
-- (tasks a limit may hold back: they go through a claim). `holds` is the key of the queue's
-- snooze holds (snooze.lua): while one is there, nothing is handed off either, so that no task
-- of a held type passes the claim by. `lanes` and `vclock` are the keys of fair partitions
-- (push_pending).
-- `now` is read on first use, so that TIME is called only when a task needs it (a process-at
-- time, a hand-off). A script that sets `pending_size` (claimable_count, read before it adds
-- tasks) has it kept up to date by add_task, and spares hand_off a ZCOUNT per task.
local function enqueue_context(runs, holds, lanes, vclock)
  return setmetatable({
    msg = KEYS[1], state = KEYS[2], priority = KEYS[3], pending = KEYS[4], scheduled = KEYS[5],
    seq = KEYS[6], active = KEYS[7], owner = KEYS[8], idle = KEYS[9], paused = KEYS[10], runs = runs,
    holds = holds, lanes = lanes, vclock = vclock,
    channel = ARGV[2], handoff_prefix = ARGV[3], lease = tonumber(ARGV[4]),
  }, {__index = function(q, name)
    if name == 'now' then
      local now = clock_now(ARGV[1])
      rawset(q, 'now', now)
      return now
    end
  end})
end

-- Hand a task to an idle worker if one is listening; return whether it was. PUBLISH counts
-- the clients it reached: a registered worker that is not listening (it lost its connection,
-- or, on a cluster, listens through another node) is dropped from the idle set instead.
-- The message published is "<id>\n<run>\n<message JSON>"; the task is this worker's first
-- run, started at once (a worker registers as idle only while it has free threads, and gives
-- back a task it has no room for).
-- An entry's score is when it expires: expired ones (a worker gone without leaving) rank first,
-- and are dropped as they are passed, so one read of the whole set serves both.
local function hand_off(q, id, body)
  if not q.runs or q.handoff_prefix == '' or (q.pending_size or claimable_count(q.pending)) > 0 then
    return false
  end
  local idle = redis.call('ZRANGE', q.idle, 0, -1, 'WITHSCORES')
  if #idle == 0 or redis.call('EXISTS', q.paused, q.holds) > 0 then
    return false
  end
  for i = 1, #idle, 2 do
    local worker = idle[i]
    redis.call('ZREM', q.idle, worker)
    if tonumber(idle[i + 1]) > q.now then
      local run = (tonumber(redis.call('HGET', q.runs, id)) or 0) + 1
      if redis.call('PUBLISH', q.handoff_prefix .. worker, id .. '\n' .. run .. '\n' .. body) > 0 then
        redis.call('HSET', q.runs, id, run)
        redis.call('ZADD', q.active, q.now + q.lease, id)
        redis.call('HSET', q.state, id, 'active')
        redis.call('HSET', q.owner, id, worker)
        return true
      end
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
  if process_at > 0 and process_at > q.now then
    redis.call('ZADD', q.scheduled, process_at, id)
    redis.call('HSET', q.state, id, 'scheduled')
    -- the queue's clock runs from its first partitioned task on, so that forward places it
    if partition_of(body) then vclock_of(q) end
  elseif not hand_off(q, id, body) then
    push_pending(q.pending, q.seq, q.priority, q.state, id, false, priority, q, body)
    if q.pending_size then q.pending_size = q.pending_size + 1 end
  end
end

-- Debounce (docs/debounce.md). A debounced task's key `lock` holds the id of the copy that
-- waits (scheduled) for its window to pass. An enqueue of the same key while that copy waits
-- is merged into it: the copy takes the newest message (with the count of merges appended) and
-- priority, and is due a window (`window` ms) from now. Otherwise (no copy, or it is due,
-- running or gone) the task is added as a new copy, due a window from now. The key outlives the
-- window by DEBOUNCE_GRACE, for a copy that waits past its due time (no worker promoted it).
-- Return the id of the copy merged into, or nil when the task was added.
local DEBOUNCE_GRACE = 60000
local function add_debounced(q, id, body, priority, lock, window)
  local due = q.now + window
  local holder = redis.call('GET', lock)
  if holder and redis.call('HGET', q.state, holder) == 'scheduled' then
    local old = redis.call('HGET', q.msg, holder) or ''
    local merged = tonumber(string.match(old, ',"merged_enqueues":(%d+)}$') or '0') + 1
    redis.call('HSET', q.msg, holder, string.sub(body, 1, -2) .. ',"merged_enqueues":' .. merged .. '}')
    if priority ~= 0 then
      redis.call('HSET', q.priority, holder, priority)
    else
      redis.call('HDEL', q.priority, holder)
    end
    redis.call('ZADD', q.scheduled, due, holder)
    redis.call('PEXPIRE', lock, window + DEBOUNCE_GRACE)
    return holder
  end
  add_task(q, id, body, priority, due, lock, window + DEBOUNCE_GRACE)
  return nil
end

-- Workflows (django_rtq/workflows). A workflow is a task of its queue in the `waiting` state
-- with a hash of its own (w.wf: kind, counters, stage, children's specs) and its children's
-- results (w.results), both deleted when it finishes. `w` holds the keys and settings of the
-- calling script, as `t` for drop_task and archive_task (it is passed to them), with w.wf,
-- w.results, w.waiting, w.completed and w.id besides.

-- The task names of workflows: not runnable, so never moved to pending (run_now.lua). The
-- same as WORKFLOW_TASKS in django_rtq/broker/workflow.py (a test checks).
local WORKFLOW_TASKS = {
  ['django_rtq.chain'] = true, ['django_rtq.group'] = true, ['django_rtq.map_reduce'] = true,
  ['django_rtq.map'] = true, ['django_rtq.iterator'] = true,
}

-- Is this stored message (JSON, or nil) a workflow's?
local function is_workflow(message)
  if not message then return false end
  local ok, decoded = pcall(cjson.decode, message)
  return ok and type(decoded) == 'table' and WORKFLOW_TASKS[decoded.task] == true
end

-- The keys and settings of a script that changes a waiting workflow (child_outcome,
-- start_postponed, cancel_workflow). They take the same sixteen keys, in this order: wf, results,
-- applied, commands, command, msg, state, waiting, completed, archived, info, result, finished,
-- priority, progress and runs; and as their first three arguments now (ms), the workflow's id,
-- and 1 to keep records for the ORM mirror (0 not to).
local function workflow_context()
  return {
    wf = KEYS[1], results = KEYS[2], applied = KEYS[3], commands = KEYS[4], command = KEYS[5],
    msg = KEYS[6], state = KEYS[7], waiting = KEYS[8], completed = KEYS[9], archived = KEYS[10],
    info = KEYS[11], result = KEYS[12], finished = KEYS[13], priority = KEYS[14], progress = KEYS[15],
    runs = KEYS[16],
    now = tonumber(ARGV[1]), id = ARGV[2], mirror = ARGV[3] == '1',
  }
end

-- A workflow whose own state in Redis is corrupt (a field a script needs is missing or holds
-- what it cannot hold, or one of its keys is not a hash) is archived with this error type, the
-- same as django_rtq.exceptions.CorruptWorkflow (a test checks), instead of making the script
-- fail: the command that found it is recorded as applied and never tried again.
local CORRUPT_WORKFLOW = 'django_rtq.exceptions.CorruptWorkflow'

-- A value as the error of a corrupt workflow shows it: quoted, at most 60 bytes, with bytes
-- that are not printable ASCII escaped (the error is JSON, read as UTF-8).
local function shown(value)
  local text = string.gsub(string.sub(value, 1, 60), '[^\32-\126]', function(c)
    return string.format('\\x%02x', string.byte(c))
  end)
  return "'" .. text .. (#value > 60 and "...'" or "'")
end

local function is_count(value)
  return value ~= nil and #value <= 15 and string.find(value, '^%d+$') ~= nil
end

-- The format version of the workflow hashes this release reads (older ones too): its "v"
-- field, absent for version 1, which is never written. The same as WORKFLOW_FORMAT in
-- broker/versions.py (a test checks).
local WORKFLOW_FORMAT = 1

-- A script that reads a workflow's hash calls this before it changes anything: the error
-- reply "NEWERFORMAT workflow <v> <WORKFLOW_FORMAT>" when the hash is of a newer format (a
-- worker of a newer release applies its commands), nil otherwise. A key that is not a hash, or
-- a "v" that is not a whole number, is left to the checks that find a workflow corrupt.
local function refuse_newer_workflow(w)
  local version = redis.pcall('HGET', w.wf, 'v')
  if type(version) == 'string' and is_count(version) and tonumber(version) > WORKFLOW_FORMAT then
    return redis.error_reply('NEWERFORMAT workflow ' .. version .. ' ' .. WORKFLOW_FORMAT)
  end
  return nil
end

-- What a workflow's field must hold where a script reads it: `test` takes its value (a string,
-- or nil when the field is missing); `expected` says what it should be, for the error. Numbers
-- are checked as Redis takes them (HINCRBY refuses "1.0", " 1" or "1e3"), not as tonumber does.
local WF_CHECK = {
  count = {expected = 'a whole number', test = is_count},
  size = {expected = 'a whole number above 0', test = function(v) return is_count(v) and tonumber(v) > 0 end},
  integer = {expected = 'an integer', test = function(v)
    return v ~= nil and #v <= 15 and string.find(v, '^%-?%d+$') ~= nil
  end},
  flag = {expected = '0 or 1', test = function(v) return v == '0' or v == '1' end},
  text = {expected = 'a non-empty string', test = function(v) return v ~= nil and v ~= '' end},
  optional = {expected = 'anything', test = function() return true end},
  -- A step's spec (see canvas.py): a JSON object with its type of node, "t".
  node = {expected = 'a JSON node', test = function(v)
    if v == nil then return false end
    local ok, node = pcall(cjson.decode, v)
    return ok and type(node) == 'table' and type(node.t) == 'string'
  end},
  kind = {expected = 'chain, group or iterator', test = function(v)
    return v == 'chain' or v == 'group' or v == 'iterator'
  end},
}

-- Why a workflow's field `name` holding `value` (nil when missing) makes it corrupt, given
-- its check (one of WF_CHECK, or a table of the same shape); nil when the value passes.
local function field_defect(name, value, check)
  if check.test(value) then return nil end
  if value == nil then return "field '" .. name .. "' is missing" end
  return "field '" .. name .. "' is " .. shown(value) .. ', not ' .. check.expected
end

-- Read fields of a workflow's hash where a script needs them, each checked: `checks` is a list
-- of {field name, check}. Returns the values by name, and why the first field that fails its
-- check makes the workflow corrupt (nil when none does).
local function read_workflow(w, checks)
  local names = {}
  for i, check in ipairs(checks) do names[i] = check[1] end
  local values = redis.call('HMGET', w.wf, unpack(names))
  local fields = {}
  for i, check in ipairs(checks) do
    local value = values[i] or nil  -- HMGET gives false for a missing field
    local defect = field_defect(check[1], value, check[2])
    if defect then return fields, defect end
    fields[check[1]] = value
  end
  return fields, nil
end

-- Why the workflow's own keys cannot be read (one holds another type than a hash), or nil.
local function workflow_keys_defect(w)
  for _, key in ipairs({w.wf, w.results}) do
    local kind = redis.call('TYPE', key).ok
    if kind ~= 'hash' and kind ~= 'none' then return 'key ' .. key .. ' is a ' .. kind .. ', not a hash' end
  end
  return nil
end

-- The command telling a workflow's own workflow (if it has one) how it ended; nil if none.
local function parent_notice(w, ok)
  local parent = redis.call('HMGET', w.wf, 'parent', 'parent_queue', 'position')
  if not parent[1] or parent[1] == '' then return nil end
  return cjson.encode({type = 'child', to = parent[1], to_queue = parent[2],
    pos = tonumber(parent[3]) or parent[3], child = w.id, ok = ok})
end

-- The workflow's info: its times, from its `created` (the time now if that is corrupt), and
-- `extra` (JSON members, each after a comma).
local function workflow_info(w, extra)
  local created = redis.call('HGET', w.wf, 'created') or nil
  created = is_count(created) and tonumber(created) or w.now
  return '{"started_at":' .. (created / 1000) .. ',"attempted_at":' .. (created / 1000) .. extra .. '}'
end

local function drop_workflow_columns(w)
  redis.call('ZREM', w.waiting, w.id)
  redis.call('DEL', w.wf, w.results)
end

-- A workflow's child's id: child_id in broker/workflow.py (MAX_ID_LENGTH, CHILD_ID_KEPT there).
local function child_id(workflow_id, pos)
  local id = workflow_id .. '.' .. pos
  if #id <= 255 then return id end
  return string.sub(workflow_id, 1, 200) .. '~' .. redis.sha1hex(id)
end

-- The workflow failed (a child failed for good, it was cancelled, or it is corrupt): cancel its
-- children that have not finished (a command to their queues; a postponed workflow has none
-- yet), then archive it (archive_task: its record for the mirror, a command to its own
-- workflow). Reads nothing it cannot cope with: a key of the workflow's that is not a hash is
-- deleted first, and a corrupt `created` gives way to the time now.
local function fail_workflow(w, error_type, error_message, child)
  for _, key in ipairs({w.wf, w.results}) do
    local kind = redis.call('TYPE', key).ok
    if kind ~= 'hash' and kind ~= 'none' then redis.call('DEL', key) end
  end
  local info_json = workflow_info(w, ',"failed_at":' .. (w.now / 1000) .. ',"error_type":' ..
    cjson.encode(error_type) .. ',"error":' .. cjson.encode(error_message) ..
    ',"failed_child":' .. cjson.encode(child or ''))
  if redis.call('HGET', w.wf, 'stage') ~= 'postponed' then
    local by_queue, any = {}, false
    local fields = redis.call('HGETALL', w.wf)
    for i = 1, #fields, 2 do
      local pos = string.match(fields[i], '^queue:(.+)$')
      if pos then
        local queue = fields[i + 1]
        by_queue[queue] = by_queue[queue] or {}
        table.insert(by_queue[queue], child_id(w.id, pos))
        any = true
      end
    end
    if any then
      write_command(w.commands, w.command, 'cancel:' .. w.id,
        cjson.encode({type = 'cancel', workflow = w.id, children = by_queue}), w.now)
    end
  end
  drop_workflow_columns(w)
  archive_task(w, w.id, info_json, nil)
end

-- The workflow's own state is corrupt (`defect`: which field or key, and what is wrong with
-- it): fail it (fail_workflow) with the error type CORRUPT_WORKFLOW. Returns the reply of the
-- script that found it, {"corrupt", the error}, for its caller to log.
local function fail_corrupt_workflow(w, defect)
  local message = 'corrupt workflow: ' .. defect
  fail_workflow(w, CORRUPT_WORKFLOW, message, nil)
  return {'corrupt', message}
end

-- The workflow succeeded with `result_json`: completed for its retention, or deleted; its own
-- workflow is told. Returns "finished"; or, when a field this needs is corrupt (created,
-- retention, and its parent's queue and position when it has a parent), fails it instead
-- (fail_corrupt_workflow) and returns what that does.
local function finish_workflow(w, result_json)
  local fields, defect = read_workflow(w, {
    {'created', WF_CHECK.count}, {'retention', WF_CHECK.count}, {'parent', WF_CHECK.optional},
  })
  if not defect and fields.parent and fields.parent ~= '' then
    fields, defect = read_workflow(w, {{'parent_queue', WF_CHECK.text}, {'position', WF_CHECK.text}})
  end
  if defect then return fail_corrupt_workflow(w, defect) end
  local notice = parent_notice(w, true)
  if notice then
    write_command(w.commands, w.command, 'child:' .. w.id,
      string.sub(notice, 1, -2) .. ',"result":' .. result_json .. '}', w.now)
  end
  local retention = tonumber(redis.call('HGET', w.wf, 'retention'))
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
    drop_task(w, w.id)
  end
  return 'finished'
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

-- The states a manual action applies to, as the caller's table gives them (ACTION_STATES in
-- broker/states.py): ARGV[at] is their count n, ARGV[at+1..at+n] their names, and
-- KEYS[first..first+n-1] their sorted sets. Returns state -> sorted set, and the next ARGV index.
local function action_sources(at, first)
  local sources, n = {}, tonumber(ARGV[at])
  for i = 1, n do sources[ARGV[at + i]] = KEYS[first + i - 1] end
  return sources, at + n + 1
end
