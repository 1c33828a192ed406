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
-- ARGV[11..] -> iterator step only: two per new child: its queue, its node JSON
--
-- Returns: "dup" (applied before), "gone" (the workflow has finished), "failed", "finished"
-- or "recorded".
local w = {
  wf = KEYS[1], results = KEYS[2], applied = KEYS[3], commands = KEYS[4], command = KEYS[5],
  msg = KEYS[6], state = KEYS[7], waiting = KEYS[8], completed = KEYS[9], archived = KEYS[10],
  info = KEYS[11], result = KEYS[12], finished = KEYS[13], priority = KEYS[14], progress = KEYS[15],
  runs = KEYS[16],
  now = tonumber(ARGV[1]), id = ARGV[2], mirror = ARGV[3] == '1',
}
local ACTIVATION_BATCH = 500
if not first_application(w.applied, ARGV[4], w.now, tonumber(ARGV[5])) then return 'dup' end
if redis.call('HGET', w.state, w.id) ~= 'waiting' then return 'gone' end
local pos, ok, payload = ARGV[6], ARGV[7] == '1', ARGV[8]
local kind, on_error = unpack(redis.call('HMGET', w.wf, 'kind', 'on_error'))
local is_driver = ARGV[9] ~= ''

if kind ~= 'iterator' and redis.call('HEXISTS', w.results, pos) == 1 then return 'dup' end
if not ok then
  if on_error ~= 'collect' or is_driver then
    local err = cjson.decode(payload)
    fail_workflow(w, err.type or '', 'child ' .. w.id .. '.' .. pos .. ' failed: ' .. (err.message or ''),
      w.id .. '.' .. pos)
    return 'failed'
  end
  payload = '{"error":' .. payload .. '}'
end
redis.call('HDEL', w.wf, 'queue:' .. pos)

-- Activation commands for new children: items are JSON objects {"pos", "node"[, "input"]}.
local function activate(items, first)
  for i = 1, #items, ACTIVATION_BATCH do
    local batch = table.concat(items, ',', i, math.min(i + ACTIVATION_BATCH - 1, #items))
    write_command(w.commands, w.command, 'activate:' .. w.id .. ':' .. first .. ':' .. i,
      '{"type":"activate","parent":' .. cjson.encode(w.id) .. ',"parent_queue":' ..
      cjson.encode(redis.call('HGET', w.wf, 'queue')) .. ',"items":[' .. batch .. ']}', w.now)
  end
end

if kind == 'chain' then
  redis.call('HSET', w.results, pos, payload)
  redis.call('HINCRBY', w.wf, 'done', 1)
  local next_pos = tonumber(pos) + 1
  local step = redis.call('HMGET', w.wf, 'step:' .. next_pos, 'step_queue:' .. next_pos, 'stage:' .. next_pos)
  if not step[1] then
    finish_workflow(w, payload)
    return 'finished'
  end
  redis.call('HSET', w.wf, 'queue:' .. next_pos, step[2])
  if step[3] then redis.call('HSET', w.wf, 'stage', step[3]) end
  activate({'{"pos":' .. next_pos .. ',"node":' .. step[1] .. ',"input":' .. payload .. '}'}, next_pos)
  return 'recorded'
end

if kind == 'group' then
  redis.call('HSET', w.results, pos, payload)
  local done = redis.call('HINCRBY', w.wf, 'done', 1)
  local n = tonumber(redis.call('HGET', w.wf, 'n'))
  if done < n then return 'recorded' end
  local parts = {}
  for first = 0, n - 1, 1000 do
    local fields = {}
    for i = first, math.min(first + 999, n - 1) do table.insert(fields, i) end
    for _, value in ipairs(redis.call('HMGET', w.results, unpack(fields))) do
      table.insert(parts, value or 'null')
    end
  end
  finish_workflow(w, '[' .. table.concat(parts, ',') .. ']')
  return 'finished'
end

-- kind == 'iterator': children are made by steps (positions d0, d1, ...) of the iterator's
-- function, a window at a time; their results are counted, not kept.
if is_driver then
  local made = tonumber(redis.call('HGET', w.wf, 'made'))
  local items = {}
  for i = 11, #ARGV, 2 do
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
local it = redis.call('HMGET', w.wf, 'exhausted', 'driving', 'active', 'window', 'steps', 'driver', 'state', 'done', 'queue')
local exhausted, driving, active, window = it[1] == '1', it[2] == '1', tonumber(it[3]), tonumber(it[4])
if not exhausted and not driving and active <= math.floor(window / 2) then
  local step = 'd' .. it[5]
  redis.call('HSET', w.wf, 'driving', '1', 'queue:' .. step, it[9])
  redis.call('HINCRBY', w.wf, 'steps', 1)
  activate({'{"pos":"' .. step .. '","node":' .. it[6] .. it[7] .. '}}}'}, step)
elseif exhausted and not driving and active == 0 then
  finish_workflow(w, it[8])
  return 'finished'
end
return 'recorded'
