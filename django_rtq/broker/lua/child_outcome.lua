-- Apply a child's outcome to its workflow, once: record it, then start the next step (chain),
-- finish when every child has (group), or ask for more children (iterator); a child that
-- failed for good fails the workflow unless it collects errors. Next steps are written as
-- activation commands of this slot, applied to their queues by a worker.
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
-- ARGV[6] -> the child's position
-- ARGV[7] -> 1 if it succeeded, 0 if it failed for good
-- ARGV[8] -> its result JSON, or its error JSON {"type", "message", "traceback"}
-- ARGV[9] -> iterator step only: the iterator's new state JSON ("" for other children)
-- ARGV[10] -> iterator step only: 1 when the iterator is exhausted
-- ARGV[11] -> the workflow's queue (the queue of these keys)
-- ARGV[12..] -> iterator step only: two per new child: its queue, its node JSON
--
-- Returns: "dup" (applied before), "gone" (the workflow has finished), "failed", "finished"
-- or "recorded"; or {"corrupt", the error} when the workflow's own state is corrupt (a field
-- this needs is missing or holds what it cannot, see WF_CHECK in _lib.lua): the workflow is
-- then archived with that error, as a failed one, and the command counts as applied; the
-- error reply "NEWERFORMAT ..." (nothing changed, the command not recorded as applied) when
-- its hash is of a newer format (refuse_newer_workflow in _lib.lua).
local w = workflow_context()
w.queue = ARGV[11]
local ACTIVATION_BATCH = 500
-- The state is read before the command is recorded as applied: a read that fails (a key of
-- the wrong type) leaves the command to be tried again.
if redis.call('HGET', w.state, w.id) ~= 'waiting' then return 'gone' end
local newer = refuse_newer_workflow(w)
if newer then return newer end
if not first_application(w.applied, ARGV[4], w.now, tonumber(ARGV[5])) then return 'dup' end
local defect = workflow_keys_defect(w)
if defect then return fail_corrupt_workflow(w, defect) end
local pos, ok, payload = ARGV[6], ARGV[7] == '1', ARGV[8]
local kind, on_error = unpack(redis.call('HMGET', w.wf, 'kind', 'on_error'))
local is_driver = ARGV[9] ~= ''

if kind ~= 'iterator' and redis.call('HEXISTS', w.results, pos) == 1 then return 'dup' end
if not ok then
  if on_error ~= 'collect' or is_driver then
    local decoded, err = pcall(cjson.decode, payload)
    if not decoded or type(err) ~= 'table' then err = {} end
    local message = type(err.message) == 'string' and err.message or ''
    local child = child_id(w.id, pos)
    fail_workflow(w, type(err.type) == 'string' and err.type or '',
      'child ' .. child .. ' failed: ' .. message, child)
    return 'failed'
  end
  payload = '{"error":' .. payload .. '}'
end
redis.call('HDEL', w.wf, 'queue:' .. pos)
defect = field_defect('kind', kind or nil, WF_CHECK.kind)
if defect then return fail_corrupt_workflow(w, defect) end
-- The workflow's `queue` field, where a script needs it, must name the queue it is in.
local OWN_QUEUE = {expected = 'its queue ' .. shown(w.queue), test = function(v) return v == w.queue end}

-- A chain's or group's child at `pos`, which must be one of its `n` children.
local function position_defect(n)
  if is_count(pos) and tonumber(pos) < n then return nil end
  return 'child ' .. shown(child_id(w.id, pos)) .. ' is not one of its ' .. n .. ' children'
end

-- Activation commands for new children: items are JSON objects {"pos", "node"[, "input"]}.
local function activate(items, first)
  for i = 1, #items, ACTIVATION_BATCH do
    local batch = table.concat(items, ',', i, math.min(i + ACTIVATION_BATCH - 1, #items))
    write_command(w.commands, w.command, 'activate:' .. w.id .. ':' .. first .. ':' .. i,
      '{"type":"activate","parent":' .. cjson.encode(w.id) .. ',"parent_queue":' ..
      cjson.encode(w.queue) .. ',"items":[' .. batch .. ']}', w.now)
  end
end

if kind == 'chain' then
  local counts, defect = read_workflow(w, {{'n', WF_CHECK.size}, {'done', WF_CHECK.count}})
  local n = tonumber(counts.n)
  defect = defect or position_defect(n)
  local next_pos = (tonumber(pos) or 0) + 1
  local step = {}
  if not defect and next_pos < n then
    step, defect = read_workflow(w, {
      {'step:' .. next_pos, WF_CHECK.node}, {'step_queue:' .. next_pos, WF_CHECK.text},
      {'stage:' .. next_pos, WF_CHECK.optional}, {'queue', OWN_QUEUE},
    })
  end
  if defect then return fail_corrupt_workflow(w, defect) end
  redis.call('HSET', w.results, pos, payload)
  redis.call('HINCRBY', w.wf, 'done', 1)
  if next_pos >= n then return finish_workflow(w, payload) end
  redis.call('HSET', w.wf, 'queue:' .. next_pos, step['step_queue:' .. next_pos])
  if step['stage:' .. next_pos] then redis.call('HSET', w.wf, 'stage', step['stage:' .. next_pos]) end
  activate({'{"pos":' .. next_pos .. ',"node":' .. step['step:' .. next_pos] .. ',"input":' .. payload .. '}'}, next_pos)
  return 'recorded'
end

if kind == 'group' then
  local counts, defect = read_workflow(w, {{'n', WF_CHECK.size}, {'done', WF_CHECK.count}})
  local n = tonumber(counts.n)
  defect = defect or position_defect(n)
  if defect then return fail_corrupt_workflow(w, defect) end
  redis.call('HSET', w.results, pos, payload)
  local done = redis.call('HINCRBY', w.wf, 'done', 1)
  if done < n then return 'recorded' end
  local parts = {}
  for first = 0, n - 1, 1000 do
    local positions = {}
    for i = first, math.min(first + 999, n - 1) do table.insert(positions, i) end
    for _, value in ipairs(redis.call('HMGET', w.results, unpack(positions))) do
      table.insert(parts, value or 'null')
    end
  end
  return finish_workflow(w, '[' .. table.concat(parts, ',') .. ']')
end

-- kind == 'iterator': children are made by steps (positions d0, d1, ...) of the iterator's
-- function, a window at a time; their results are counted, not kept. Its next step's node is
-- `driver` .. its state .. '}}' (see _iterator in planner.py): checked before anything moves.
local fields
fields, defect = read_workflow(w, {
  {'made', WF_CHECK.count}, {'active', WF_CHECK.integer}, {'done', WF_CHECK.count},
  {'exhausted', WF_CHECK.flag}, {'driving', WF_CHECK.flag}, {'window', WF_CHECK.size},
  {'steps', WF_CHECK.count}, {'driver', WF_CHECK.text}, {'state', WF_CHECK.text}, {'queue', OWN_QUEUE},
})
if not defect and not WF_CHECK.node.test(fields.driver .. (is_driver and ARGV[9] or fields.state) .. '}}') then
  defect = "fields 'driver' and 'state' do not make the JSON node of its next step"
end
if defect then return fail_corrupt_workflow(w, defect) end
if is_driver then
  local made = tonumber(fields.made)
  local items = {}
  for i = 12, #ARGV, 2 do
    redis.call('HSET', w.wf, 'queue:' .. made, ARGV[i])
    table.insert(items, '{"pos":' .. made .. ',"node":' .. ARGV[i + 1] .. '}')
    made = made + 1
  end
  redis.call('HSET', w.wf, 'state', ARGV[9], 'exhausted', ARGV[10], 'driving', '0', 'made', made)
  redis.call('HINCRBY', w.wf, 'active', #items)
  activate(items, 'c' .. (made - #items))
else
  redis.call('HINCRBY', w.wf, 'active', -1)
  redis.call('HINCRBY', w.wf, 'done', 1)
end
local it = redis.call('HMGET', w.wf, 'exhausted', 'driving', 'active', 'window', 'steps', 'driver', 'state', 'done')
local exhausted, driving, active, window = it[1] == '1', it[2] == '1', tonumber(it[3]), tonumber(it[4])
if not exhausted and not driving and active <= math.floor(window / 2) then
  local step = 'd' .. it[5]
  redis.call('HSET', w.wf, 'driving', '1', 'queue:' .. step, w.queue)
  redis.call('HINCRBY', w.wf, 'steps', 1)
  activate({'{"pos":"' .. step .. '","node":' .. it[6] .. it[7] .. '}}}'}, step)
elseif exhausted and not driving and active == 0 then
  return finish_workflow(w, it[8])
end
return 'recorded'
