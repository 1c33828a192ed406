-- Claim up to `limit` pending tasks, highest priority first: move them to active under a
-- lease held by the worker, and return their messages, attempt facts and run numbers. The
-- first `start_now` go straight to free threads; the others wait in the worker's memory and
-- are marked unstarted until the worker reports their start (extend_leases), so that a task
-- recovered from a dead worker is known to have never run. A worker that finds fewer than it
-- asked for is registered as idle, so that the next task enqueued to an empty queue is handed
-- straight to it (see enqueue.lua); one that finds enough is not.
--
-- Flow control (broker/limits.py), only for a queue given limits or holding tasks back: a task
-- whose type is at its rate or concurrency limit is held back (moved behind every task that can
-- run, see HELD_BASE) and the claim goes on to the next, so other types are not held up behind
-- it; held tasks go back to their place once their type may start one (release_held). A queue's
-- own limit caps the claim. Limited tasks are claimed only to start at once (`start_now`), so
-- that a start counts when it happens. Each start takes a token of its scope's bucket, and a
-- concurrency slot that the task holds while active (release_slots in _lib.lua).
--
-- Snooze holds (snooze.lua): a type a handler's Snooze(hold_type=True) holds until a time is
-- limited with no room until then, so its tasks are held back like those of a type at its rate
-- limit, and the worker is told to claim again when the hold ends. A hold that has ended is
-- dropped. A queue without limits or holds pays one EXISTS of two keys for all this.
--
-- Partitions (docs/partitions.md): a type's partition limits apply to each of its partitions as
-- a scope of its own, "<task>\2<partition>" (a partition the type names has its own, else the
-- type's "<task>\2"); a task is held back when its type or its partition is at its limit. The
-- claim moves the queue's virtual clock (`vclock`) to the furthest place it took a task from, so
-- that a partition that comes later is placed beside the claims (push_pending in _lib.lua).
--
-- KEYS[1] -> rtq:{<queue>}:pending
-- KEYS[2] -> rtq:{<queue>}:active
-- KEYS[3] -> rtq:{<queue>}:state
-- KEYS[4] -> rtq:{<queue>}:owner
-- KEYS[5] -> rtq:{<queue>}:msg
-- KEYS[6] -> rtq:{<queue>}:info
-- KEYS[7] -> rtq:{<queue>}:paused
-- KEYS[8] -> rtq:{<queue>}:idle
-- KEYS[9] -> rtq:{<queue>}:runs
-- KEYS[10] -> rtq:{<queue>}:unstarted
-- KEYS[11] -> rtq:{<queue>}:held
-- KEYS[12] -> rtq:{<queue>}:buckets
-- KEYS[13] -> rtq:{<queue>}:running
-- KEYS[14] -> rtq:{<queue>}:slots
-- KEYS[15] -> rtq:{<queue>}:parked
-- KEYS[16] -> rtq:{<queue>}:parked_kinds
-- KEYS[17] -> rtq:{<queue>}:holds
-- KEYS[18] -> rtq:{<queue>}:lanes
-- KEYS[19] -> rtq:{<queue>}:vclock
-- KEYS[20] -> rtq:{<queue>}:seq
-- ARGV[1] -> now (ms; 0 = the server's clock)
-- ARGV[2] -> lease (ms)
-- ARGV[3] -> worker id
-- ARGV[4] -> limit
-- ARGV[5] -> how many of the claimed tasks start at once (the rest are marked unstarted)
-- ARGV[6] -> how long (ms) to stay registered as idle; 0 = do not register
-- ARGV[7] -> the queue's limits by scope, JSON ({"<task>": {"r": starts, "p": per ms, "b": bucket,
--            "c": running}, "*": the queue's own, "<task>\2": each partition's of a type,
--            "<task>\2<partition>": a partition's own}); "" when it has none
-- ARGV[8] -> the task types this worker does not know, "\n"-joined: their pending tasks are
--            parked as the claim passes them ("" for none)
-- ARGV[9] -> the parked kinds this worker can run, "\n"-joined: taken before pending
-- ARGV[10] -> the parked kinds this worker cannot run, "\n"-joined
-- ARGV[11] -> wake channel (published when the claim parked tasks)
--
-- Returns: a flat list of id, message JSON, info JSON, run number per claimed task (false
-- where missing); empty of tasks when the queue is paused or has nothing pending. Three more
-- elements end the list: the ms until the worker should claim again because a rate limit then
-- lets a waiting task start, or because the claim stopped short (0: at once; -1: no such wait,
-- a freed concurrency slot wakes the workers instead); 1 when tasks the limits let start wait
-- only for a free thread of this worker (0 otherwise); and notes for the worker, JSON or "":
-- "kinds", parked kinds it was told neither way of (it says at its next claim, made at once:
-- this one took nothing from pending, so that tasks it can run of those kinds go first), and
-- "refused_by", for each task taken from a kind of arguments that did not bind, the
-- fingerprints that refused them.
local pending, active, state, owner, msg, info, paused, idle, runs, unstarted =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local now, lease, worker = clock_now(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local limit, start_now, idle_for = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
-- Tasks a claim looks at beyond those it takes (held back), at most: about 2 ms of work.
local SCAN_LIMIT = 200
-- Held tasks a claim moves back to pending (or finds gone), at most.
local RELEASE_LIMIT = 1000
-- Scopes holding tasks back (types, partitions) a claim looks at, at most.
local SCOPE_VISITS = 100
-- Parked kinds a claim tells the worker of at once, at most (it judges them, and claims again).
local KINDS_LIMIT = 50
-- Of a rate limit's accrual, how much (ms) a claim may come late without its start being lost:
-- the wake-up, the round trip. Less than a token, so a bucket never lets an extra start through.
local LATENESS_MS = 2

-- The flow control of this claim: the limits by scope, and their use, each read once.
local fc = {
  held = KEYS[11], buckets = KEYS[12], running = KEYS[13], slots = KEYS[14], holds = KEYS[17],
  limits = {}, tokens = {}, in_use = {}, spent = {}, added = {}, slot_of = {}, hold_until = {},
  wait = -1, thread_bound = false, partition_holds = false,
}

-- Fair partitions: the furthest place in pending (within its priority band) this claim took.
local fair = {lanes = KEYS[18], vclock = KEYS[19], seq = KEYS[20], top = 0}

local function note_place(score)
  local place = tonumber(score) % PRIORITY_BAND
  if place > fair.top then fair.top = place end
end

-- Move the queue's virtual clock (once it has one: its first partitioned task started it) to the
-- furthest place claimed. The lanes it passed are dropped (their next turn is past the clock
-- anyway), and `seq`, the lane of the tasks without a partition, is brought up to it.
local function advance_vclock()
  if fair.top == 0 then return end
  local clock = tonumber(redis.call('GET', fair.vclock))
  if not clock or fair.top <= clock then return end
  redis.call('SET', fair.vclock, fair.top)
  redis.call('ZREMRANGEBYSCORE', fair.lanes, '-inf', fair.top)
  if (tonumber(redis.call('GET', fair.seq)) or 0) < fair.top then redis.call('SET', fair.seq, fair.top) end
end

-- A "\n"-joined list as a set; nil for "".
local function set_of(joined)
  if joined == '' then return nil end
  local set = {}
  for name in string.gmatch(joined, '[^\n]+') do set[name] = true end
  return set
end

-- Tasks this worker's release cannot run (broker/waiting.py): what it told of them, what this
-- claim parked, and the notes it gets back.
local wk = {
  leave = set_of(ARGV[8]), take = set_of(ARGV[9]) or {}, refused = set_of(ARGV[10]) or {},
  p = {pending = pending, state = state, parked = KEYS[15], kinds = KEYS[16]},
  parked = 0, notes = {kinds = {}, refused_by = {}}, noted = false,
}

-- Park a pending task of a type this worker does not know, if it is one; return whether it was.
local function parked_unknown(task, score, id)
  if not (wk.leave and task and wk.leave[task]) then return false end
  park_task(wk.p, task .. '\1type', score, id, now, "unknown task type '" .. task .. "'")
  wk.parked = wk.parked + 1
  return true
end

-- The task name of a stored message: it is written first (TaskMessage.to_json).
local function task_of(body)
  if not body then return nil end
  local name = string.match(body, '^{"task":"([^"\\]*)"')
  if name then return name end
  local ok, decoded = pcall(cjson.decode, body)
  if ok and type(decoded) == 'table' and type(decoded.task) == 'string' then return decoded.task end
  return nil
end

-- The tokens in a scope's bucket now: refilled at r per p ms since its last use, up to b (and
-- LATENESS_MS of accrual). A bucket unused, or unreadable, is full; one stamped later than now
-- (the server's clock stepped back) refills from now.
local function tokens(scope, lim)
  if fc.tokens[scope] == nil then
    local cap = lim.b + math.min(0.5, LATENESS_MS * lim.r / lim.p)
    local left = lim.b
    local raw = redis.call('HGET', fc.buckets, scope)
    local stored, at = nil, nil
    if raw then stored, at = string.match(raw, '^(%d+%.?%d*):(%d+)$') end
    stored, at = tonumber(stored), tonumber(at)
    if stored and at and stored <= cap then
      if at > now then
        at = now
        fc.spent[scope] = true
      end
      left = math.min(cap, stored + (now - at) * lim.r / lim.p)
    end
    fc.tokens[scope] = left
  end
  return fc.tokens[scope]
end

-- The slots a scope's tasks hold (a count that is not one reads as none: the next take rewrites it).
local function in_use(scope)
  if fc.in_use[scope] == nil then
    local raw = redis.call('HGET', fc.running, scope)
    fc.in_use[scope] = (raw and string.match(raw, '^%d+$')) and tonumber(raw) or 0
  end
  return fc.in_use[scope]
end

-- Note in fc.wait how soon a rate limit whose bucket holds `left` tokens allows a start.
local function note_wait(lim, left)
  if left < 1 then
    local wait = math.ceil((1 - left) * lim.p / lim.r)
    if fc.wait < 0 or wait < fc.wait then fc.wait = wait end
  end
end

-- The limits of a scope: a type's, the queue's, or a partition's ("<task>\2<partition>": its own
-- if the type names it, else the type's for each partition, "<task>\2"); false for none.
local function limit_of(scope)
  local lim = fc.limits[scope]
  if lim == nil then
    local task = string.match(scope, '^(.-)\2.')
    lim = task and fc.limits[task .. '\2']
    if type(lim) ~= 'table' then lim = false end
    fc.limits[scope] = lim
  end
  return lim
end

-- The partition scope of a task (its type's name and message body), when its type has partition
-- limits or a snooze holds one of its partitions; nil otherwise.
local function partition_scope(task, body)
  if not task or not (type(fc.limits[task .. '\2']) == 'table' or fc.partition_holds) then return nil end
  local partition = partition_of(body)
  if not partition then return nil end
  local scope = task .. '\2' .. partition
  if limit_of(scope) then return scope end
  return nil
end

-- How many tasks of a scope may start now (math.huge when it has no limits). When only its rate
-- stops them, note in fc.wait how soon it will allow one.
local function room(scope)
  local lim = limit_of(scope)
  if type(lim) ~= 'table' then return math.huge end
  local held_until = fc.hold_until[scope]
  if held_until then
    local wait = held_until - now
    if fc.wait < 0 or wait < fc.wait then fc.wait = wait end
    return 0
  end
  local free = math.huge
  if lim.c then free = math.max(0, lim.c - in_use(scope)) end
  if lim.r and free > 0 then
    local left = tokens(scope, lim)
    note_wait(lim, left)
    free = math.min(free, math.floor(left))
  end
  return free
end

-- Count a start of task `id` against a scope's limits: a token, and a slot it holds while active.
-- A start that empties the bucket notes when the next is allowed: the tasks that wait for it may
-- be held already, and no later room() of this claim would see them.
local function take(scope, id)
  local lim = limit_of(scope)
  if type(lim) ~= 'table' then return end
  if lim.r then
    fc.tokens[scope] = tokens(scope, lim) - 1
    fc.spent[scope] = true
    note_wait(lim, fc.tokens[scope])
  end
  if lim.c then
    fc.in_use[scope] = in_use(scope) + 1
    fc.added[scope] = (fc.added[scope] or 0) + 1
    fc.slot_of[id] = fc.slot_of[id] and (fc.slot_of[id] .. '\n' .. scope) or scope
  end
end

local function hold(task, score, id)
  redis.call('ZADD', pending, HELD_BASE + score, id)
  redis.call('ZADD', fc.held, 0, task .. '\0' .. string.format('%017.0f', score) .. '\0' .. id)
end

-- Move held tasks back to their place in pending, for each scope as many as its limits let start
-- now (all, up to `most`, for a scope no longer limited). An entry whose task is not held any more
-- (deleted by hand, or settled late), or that is not an entry, is dropped. A claim that runs out
-- of budget asks to be followed by another at once (fc.wait = 0). A type's partitions may hold
-- thousands of scopes: a claim visits SCOPE_VISITS of them at most, in order from the scope of a
-- held task picked at random and round to it again, so that each scope has its turn.
local function release_held(most)
  local budget, visits = RELEASE_LIMIT, 0
  local picked = redis.call('ZRANDMEMBER', fc.held, 1)
  picked = type(picked) == 'table' and picked[1]  -- (fakeredis answers a missing key with nil)
  if type(picked) ~= 'string' then return end
  local first = string.match(picked, '^(.-)%z') or ''
  -- the scopes from the first picked to the end of the index, then from its start to that one
  local laps = {{'[' .. first, '+'}, {'-', '(' .. first}}
  if first == '' then laps = {{'-', '+'}} end
  for _, lap in ipairs(laps) do
    local from, upto = lap[1], lap[2]
    while budget > 0 and visits < SCOPE_VISITS do
      local head = redis.call('ZRANGEBYLEX', fc.held, from, upto, 'LIMIT', 0, 1)[1]
      if not head then break end
      local scope = string.match(head, '^(.-)%z%d+%z.')
      if not scope then
        redis.call('ZREM', fc.held, head)
        budget = budget - 1
      else
        visits = visits + 1
        local wanted, released = math.min(room(scope), most), 0
        while released < wanted and budget > 0 do
          local entries = redis.call('ZRANGEBYLEX', fc.held, '[' .. scope .. '\0', '(' .. scope .. '\1',
            'LIMIT', 0, math.min(wanted - released, budget))
          if #entries == 0 then break end
          for _, entry in ipairs(entries) do
            budget = budget - 1
            redis.call('ZREM', fc.held, entry)
            local score, id = string.match(string.sub(entry, #scope + 2), '^(%d+)%z(.+)$')
            if score and tonumber(redis.call('ZSCORE', pending, id)) == HELD_BASE + tonumber(score) then
              redis.call('ZADD', pending, score, id)
              released = released + 1
            end
          end
        end
        from = '[' .. scope .. '\1'
      end
    end
  end
  if budget <= 0 then fc.wait = 0 end
end

-- Take up to `want` tasks that may start, in pending order, holding back those their type's
-- limits stop. Each chunk is read (ids, scores, messages) before anything is changed.
local function take_under_limits(want, already)
  local ids, scanned = {}, 0
  local queue_limited = type(fc.limits['*']) == 'table'
  while #ids < want do
    if scanned >= SCAN_LIMIT + want then
      fc.wait = 0  -- a long run of held tasks: the rest of the queue at the next claim, at once
      break
    end
    local chunk = redis.call('ZRANGE', pending, 0, want - #ids - 1, 'WITHSCORES')
    if #chunk == 0 then break end
    local chunk_ids = {}
    for i = 1, #chunk, 2 do chunk_ids[#chunk_ids + 1] = chunk[i] end
    local bodies = call_for_all('HMGET', msg, chunk_ids)
    local taken, stop = {}, false
    for k, id in ipairs(chunk_ids) do
      local score = tonumber(chunk[2 * k])
      if score >= HELD_BASE then
        stop = true  -- only held tasks are left
        break
      end
      scanned = scanned + 1
      local task = task_of(bodies[k])
      local limited = task and type(fc.limits[task]) == 'table'
      local partitioned = partition_scope(task, bodies[k])
      if parked_unknown(task, score, id) then
        -- left for a worker that knows its type
      elseif limited and room(task) < 1 then
        hold(task, score, id)
      elseif partitioned and room(partitioned) < 1 then
        hold(partitioned, score, id)
      elseif (limited or partitioned) and already + #ids >= start_now then
        -- It could start, but only on a free thread: a limited task never waits in a worker's memory.
        fc.thread_bound = true
        stop = true
        break
      else
        if limited then take(task, id) end
        if partitioned then take(partitioned, id) end
        if queue_limited then take('*', id) end
        ids[#ids + 1] = id
        taken[#taken + 1] = id
        note_place(score)
      end
    end
    if #taken > 0 then call_for_all('ZREM', pending, taken) end
    if stop then break end
  end
  return ids
end

-- Take pending tasks in order, up to `want`, parking those of types this worker does not know
-- (a plain ZPOPMIN does when there are none and nothing is parked).
local function take_plain(want)
  local ids, scanned = {}, 0
  while #ids < want do
    if scanned >= SCAN_LIMIT + want then
      fc.wait = 0  -- a long run of tasks left for others: the rest at the next claim, at once
      break
    end
    local chunk = redis.call('ZRANGEBYSCORE', pending, '-inf', '(' .. HELD_BASE_TEXT, 'WITHSCORES',
      'LIMIT', 0, want - #ids)
    if #chunk == 0 then break end
    local chunk_ids = {}
    for i = 1, #chunk, 2 do chunk_ids[#chunk_ids + 1] = chunk[i] end
    local bodies = wk.leave and call_for_all('HMGET', msg, chunk_ids) or {}
    local taken = {}
    for k, id in ipairs(chunk_ids) do
      scanned = scanned + 1
      if not parked_unknown(task_of(bodies[k]), tonumber(chunk[2 * k]), id) then
        ids[#ids + 1] = id
        taken[#taken + 1] = id
        note_place(chunk[2 * k])
      end
    end
    if #taken > 0 then call_for_all('ZREM', pending, taken) end
  end
  return ids
end

-- May a parked task of `task` start now under the flow-control limits? 'take' (its start
-- counted), 'wait' (its type's limits stop it: it stays parked), or 'stop' (no more now).
local function admit(task, id, count)
  local queue_limited = type(fc.limits['*']) == 'table'
  local limited = type(fc.limits[task]) == 'table'
  local partitioned = nil
  if type(fc.limits[task .. '\2']) == 'table' or fc.partition_holds then
    partitioned = partition_scope(task, redis.call('HGET', msg, id))
  end
  if limited and room(task) < 1 then return 'wait' end
  if partitioned and room(partitioned) < 1 then return 'wait' end
  if (limited or partitioned) and count >= start_now then
    fc.thread_bound = true
    return 'stop'
  end
  if limited then take(task, id) end
  if partitioned then take(partitioned, id) end
  if queue_limited then take('*', id) end
  return 'take'
end

-- Take parked tasks of the kinds this worker can run (the kinds are those of `parked_kinds`, by
-- task name), up to `want`, each kind's in their order, and note the kinds it was told nothing
-- of. A kind left empty is forgotten; one taken from waits afresh from now (the grace before it
-- is archived counts while no worker takes it).
local function take_parked(want, under_limits)
  local ids, taking = {}, true
  local kinds = redis.call('HKEYS', wk.p.kinds)
  table.sort(kinds)
  for _, kind in ipairs(kinds) do
    if wk.take[kind] then
      local task, refusers = string.match(kind, '^(.-)\1'), string.match(kind, '^.-\1args(\1.*)$')
      local took, blocked = false, false
      while taking and not blocked and #ids < want do
        local entries = redis.call('ZRANGEBYLEX', wk.p.parked, '[' .. kind .. '\0', '(' .. kind .. '\1',
          'LIMIT', 0, want - #ids)
        if #entries == 0 then break end
        for _, entry in ipairs(entries) do
          local score, id = string.match(string.sub(entry, #kind + 2), '^(%d+)%z(.+)$')
          if not score or tonumber(redis.call('ZSCORE', pending, id)) ~= PARKED_BASE + tonumber(score) then
            redis.call('ZREM', wk.p.parked, entry)  -- run, archived or deleted since
          else
            local verdict = under_limits and admit(task, id, #ids) or 'take'
            if verdict ~= 'take' then
              blocked = true  -- its type's limits stop it ('wait'), or all further starts ('stop')
              if verdict == 'stop' then taking = false end
              break
            end
            redis.call('ZREM', wk.p.parked, entry)
            redis.call('ZREM', pending, id)
            ids[#ids + 1] = id
            note_place(score)
            took = true
            if refusers then
              wk.notes.refused_by[id] = refusers
              wk.noted = true
            end
          end
        end
      end
      if redis.call('ZLEXCOUNT', wk.p.parked, '[' .. kind .. '\0', '(' .. kind .. '\1') == 0 then
        redis.call('HDEL', wk.p.kinds, kind)
      elseif took then
        local ok, facts = pcall(cjson.decode, redis.call('HGET', wk.p.kinds, kind) or '')
        if not (ok and type(facts) == 'table') then facts = {} end
        facts.since = now
        redis.call('HSET', wk.p.kinds, kind, cjson.encode(facts))
      end
    elseif not wk.refused[kind] and #wk.notes.kinds < KINDS_LIMIT then
      wk.notes.kinds[#wk.notes.kinds + 1] = kind
      wk.noted = true
    end
  end
  return ids
end

-- Read the snooze holds: a type held until later is limited with no room (room above) until
-- then; holds that have ended (or that are not a time) are dropped.
local function read_holds()
  local raw = redis.call('HGETALL', fc.holds)
  local ended = {}
  for i = 1, #raw, 2 do
    local task, held_until = raw[i], tonumber(raw[i + 1])
    if held_until and held_until > now then
      fc.hold_until[task] = held_until
      if not limit_of(task) then fc.limits[task] = {} end
      if string.find(task, '\2', 1, true) then fc.partition_holds = true end
    else
      ended[#ended + 1] = task
    end
  end
  if #ended > 0 then call_for_all('HDEL', fc.holds, ended) end
end

-- A rate-limited partition's bucket stays in `buckets` after its tasks are done, and tenants come
-- and go. A full bucket is the same as none: a claim drops the full ones among BUCKET_SAMPLE
-- fields picked at random (only when some partition has a rate limit, so that it is bounded work).
local BUCKET_SAMPLE = 10
local function drop_full_buckets()
  local rated = false
  for scope, lim in pairs(fc.limits) do
    if type(lim) == 'table' and lim.r and string.find(scope, '\2', 1, true) then
      rated = true
      break
    end
  end
  if not rated then return end
  local sample = redis.call('HRANDFIELD', fc.buckets, BUCKET_SAMPLE)
  if type(sample) ~= 'table' then return end  -- (fakeredis answers a missing key with nil)
  local full = {}
  for _, scope in ipairs(sample) do
    if string.find(scope, '\2', 1, true) and not fc.spent[scope] then
      local lim = limit_of(scope)
      if type(lim) == 'table' and lim.r and tokens(scope, lim) >= lim.b and not fc.spent[scope] then
        full[#full + 1] = scope
      end
    end
  end
  if #full > 0 then call_for_all('HDEL', fc.buckets, full) end
end

local function save_use()
  for scope in pairs(fc.spent) do
    redis.call('HSET', fc.buckets, scope, string.format('%.6f:%d', fc.tokens[scope], now))
  end
  for scope in pairs(fc.added) do redis.call('HSET', fc.running, scope, fc.in_use[scope]) end
  for id, scopes in pairs(fc.slot_of) do redis.call('HSET', fc.slots, id, scopes) end
end

-- A flow-control key of the wrong type stops the claim before it changes anything.
local function check_flow_keys()
  local kinds = {
    [fc.held] = 'zset', [fc.buckets] = 'hash', [fc.running] = 'hash', [fc.slots] = 'hash', [fc.holds] = 'hash',
  }
  for key, kind in pairs(kinds) do
    local found = redis.call('TYPE', key).ok
    if found ~= kind and found ~= 'none' then
      return redis.error_reply('WRONGTYPE the flow-control key ' .. key .. ' holds a ' .. found .. ', not a ' .. kind)
    end
  end
  return nil
end

redis.call('ZREM', idle, worker)
if redis.call('EXISTS', paused) == 1 then return {-1, 0, ''} end
local ids = {}
local limited = ARGV[7] ~= '' or redis.call('EXISTS', fc.held, fc.holds) > 0
local parked_exist = redis.call('EXISTS', wk.p.parked) == 1
if not limited then
  if parked_exist then ids = take_parked(limit, false) end
  if #wk.notes.kinds > 0 then
    -- kinds the worker has not judged: it judges them and claims again, before anything pending
  elseif #ids < limit and (wk.leave or parked_exist) then
    for _, id in ipairs(take_plain(limit - #ids)) do ids[#ids + 1] = id end
  elseif #ids < limit then
    local popped = redis.call('ZPOPMIN', pending, limit - #ids)
    for i = 1, #popped, 2 do
      ids[#ids + 1] = popped[i]
      note_place(popped[i + 1])
    end
  end
else
  local wrong = check_flow_keys()
  if wrong then return wrong end
  if ARGV[7] ~= '' then fc.limits = cjson.decode(ARGV[7]) end
  read_holds()
  local want = limit
  if type(fc.limits['*']) == 'table' then
    -- The queue's own limit: every task counts, and none waits in a worker's memory.
    local allowed = math.min(limit, room('*'))
    want = math.min(allowed, start_now)
    fc.thread_bound = want < allowed
  end
  if want > 0 then
    if parked_exist then ids = take_parked(want, true) end
    if #wk.notes.kinds == 0 then
      if want > #ids then release_held(want - #ids) end
      for _, id in ipairs(take_under_limits(want - #ids, #ids)) do ids[#ids + 1] = id end
    end
    drop_full_buckets()
    save_use()
  end
  if fc.thread_bound and claimable_count(pending) == 0 then fc.thread_bound = false end
end

advance_vclock()

local reply = {}
if #ids > 0 then
  local leases, states, owners = {}, {}, {}
  for n, id in ipairs(ids) do
    leases[2 * n - 1], leases[2 * n] = now + lease, id
    states[2 * n - 1], states[2 * n] = id, 'active'
    owners[2 * n - 1], owners[2 * n] = id, worker
  end
  -- One command per column for the whole batch: far cheaper than one per task.
  call_for_all('ZADD', active, leases)
  call_for_all('HSET', state, states)
  call_for_all('HSET', owner, owners)
  local waiting = {}
  for k = start_now + 1, #ids do waiting[#waiting + 1] = ids[k] end
  if #waiting > 0 then call_for_all('SADD', unstarted, waiting) end
  local messages, infos = call_for_all('HMGET', msg, ids), call_for_all('HMGET', info, ids)
  for k, id in ipairs(ids) do
    reply[#reply + 1] = id
    reply[#reply + 1] = messages[k]
    reply[#reply + 1] = infos[k]
    reply[#reply + 1] = redis.call('HINCRBY', runs, id, 1)
  end
end
if #ids < limit and idle_for > 0 then
  redis.call('ZADD', idle, now + idle_for, worker)
end
if wk.parked > 0 then redis.call('PUBLISH', ARGV[11], '1') end
if limited and fc.wait > 0 and redis.call('ZCARD', pending) == 0 then fc.wait = -1 end
reply[#reply + 1] = fc.wait
reply[#reply + 1] = fc.thread_bound and 1 or 0
reply[#reply + 1] = wk.noted and cjson.encode(wk.notes) or ''
return reply
