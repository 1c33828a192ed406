-- Settle a batch of tasks that succeeded: keep each as completed for its retention, or
-- delete it; release its uniqueness lock, count it as processed, and (when mirroring) keep
-- its record for the ORM mirror.
-- Results are fenced by run (see take_for_settling in _lib.lua): a result that comes late,
-- after a newer run of the task started, is left out.
--
-- KEYS[1] -> rtq:{<queue>}:active
-- KEYS[2] -> rtq:{<queue>}:owner
-- KEYS[3] -> rtq:{<queue>}:state
-- KEYS[4] -> rtq:{<queue>}:msg
-- KEYS[5] -> rtq:{<queue>}:info
-- KEYS[6] -> rtq:{<queue>}:result
-- KEYS[7] -> rtq:{<queue>}:priority
-- KEYS[8] -> rtq:{<queue>}:completed
-- KEYS[9] -> rtq:{<queue>}:processed:<day>
-- KEYS[10] -> rtq:{<queue>}:finished
-- KEYS[11] -> rtq:{<queue>}:progress
-- KEYS[12] -> rtq:{<queue>}:commands
-- KEYS[13] -> rtq:{<queue>}:command
-- KEYS[14] -> rtq:{<queue>}:runs
-- KEYS[15] -> rtq:{<queue>}:unstarted
-- KEYS[16] -> rtq:{<queue>}:pending
-- KEYS[17] -> rtq:{<queue>}:retry
-- KEYS[18] -> rtq:{<queue>}:slots
-- KEYS[19] -> rtq:{<queue>}:running
-- KEYS[20] -> rtq:{<queue>}:began
-- KEYS[21..] -> rtq:{<queue>}:unique:<key>, one per task that has a unique key
-- ARGV[1] -> now (ms)
-- ARGV[2] -> worker id
-- ARGV[3] -> counter TTL (s)
-- ARGV[4] -> 1 to keep records for the ORM mirror, 0 not to
-- ARGV[5] -> wake channel (published to when a freed concurrency slot may let a task start)
-- ARGV[6..] -> seven per task: id, run number, info JSON (or "<started>,<finished>" in epoch seconds
--              for a first attempt: the script writes its info), result JSON, retention (ms),
--              index of its unique key in KEYS (0 = none), and for a workflow's child the
--              command to its workflow up to its result ("" for other tasks)
--
-- Returns: the number of tasks settled (the others' results came late).
local active, owner, state, msg, info, result, priority, completed, processed, finished =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local progress, commands, command = KEYS[11], KEYS[12], KEYS[13]
local t = {runs = KEYS[14], state = state, active = active, owner = owner, unstarted = KEYS[15],
  pending = KEYS[16], retry = KEYS[17], slots = KEYS[18], running = KEYS[19], began = KEYS[20]}
local now, worker, counter_ttl, mirror = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4] == '1'
local FIRST, FIELDS = 6, 7
local worker_json = cjson.encode(worker)

-- The info of a first attempt that succeeded, from its start and finish times.
local function first_attempt_info(times)
  local started, finished = string.match(times, '^([^,]+),([^,]+)$')
  return '{"started_at":' .. started .. ',"attempted_at":' .. started .. ',"finished_at":' .. finished ..
    ',"worker":' .. worker_json .. ',"workers":[' .. worker_json .. ']}'
end

-- Which tasks this batch may settle (see take_for_settling in _lib.lua), read for the whole
-- batch at once. A task named twice is settled once: after the first, it is no longer there.
local ids = {}
for i = FIRST, #ARGV, FIELDS do ids[#ids + 1] = ARGV[i] end
local run_now, state_now = call_for_all('HMGET', t.runs, ids), call_for_all('HMGET', state, ids)
local owner_now = call_for_all('HMGET', owner, ids)
local taken, from_active, from_pending, from_retry, dropped = {}, {}, {}, {}, {}

local settled = 0
for n, id in ipairs(ids) do
  local i = FIRST + (n - 1) * FIELDS
  local was = state_now[n]
  local ours = not taken[id] and run_now[n] == ARGV[i + 1] and (
    (was == 'active' and owner_now[n] == worker) or was == 'pending' or was == 'retry')
  if ours then
    taken[id] = true
    if was == 'active' then
      from_active[#from_active + 1] = id
    elseif was == 'pending' then
      from_pending[#from_pending + 1] = id
    else
      from_retry[#from_retry + 1] = id
    end
    local info_json, result_json, notice = ARGV[i + 2], ARGV[i + 3], ARGV[i + 6]
    local retention, unique_index = tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5])
    if (mirror or retention > 0) and string.sub(info_json, 1, 1) ~= '{' then
      info_json = first_attempt_info(info_json)
    end
    if unique_index > 0 then release_unique(KEYS[unique_index], id) end
    if mirror then
      buffer_finished(finished, id, 'succeeded', now, redis.call('HGET', msg, id), info_json, result_json)
    end
    if notice ~= '' then
      write_command(commands, command, 'child:' .. id, notice .. result_json .. '}', now)
    end
    if retention > 0 then
      redis.call('HSET', state, id, 'completed')
      redis.call('HSET', info, id, info_json)
      redis.call('HSET', result, id, result_json)
      redis.call('ZADD', completed, now + retention, id)
    else
      dropped[#dropped + 1] = id
    end
    settled = settled + 1
  end
end

-- The columns and set memberships of the settled tasks, one command each for the whole batch.
if #from_active > 0 then
  call_for_all('ZREM', active, from_active)
  call_for_all('HDEL', owner, from_active)
  call_for_all('SREM', t.unstarted, from_active)
  call_for_all('HDEL', t.began, from_active)
  release_slots(t, from_active)
end
if #from_pending > 0 then call_for_all('ZREM', t.pending, from_pending) end
if #from_retry > 0 then call_for_all('ZREM', t.retry, from_retry) end
if settled > 0 then
  local all = {}
  for _, list in ipairs({from_active, from_pending, from_retry}) do
    for _, id in ipairs(list) do all[#all + 1] = id end
  end
  call_for_all('HDEL', progress, all)
end
if #dropped > 0 then
  for _, column in ipairs({state, msg, info, priority, t.runs}) do call_for_all('HDEL', column, dropped) end
end
if settled > 0 then
  redis.call('INCRBY', processed, settled)
  redis.call('EXPIRE', processed, counter_ttl)
end
wake_freed(t, t.pending, ARGV[5])
return settled
