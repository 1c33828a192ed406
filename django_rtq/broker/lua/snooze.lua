-- Settle an attempt whose handler raised Snooze: put the task in scheduled, due `delay` ms from
-- now on the server's clock, with its attempt facts (`info`: the count of its snoozes, no
-- attempt counted). With a type to hold, no task of that type starts in this queue before then
-- (claim.lua reads the queue's holds): a hold already there that lasts longer is kept.
-- Fenced by run like fail.lua (take_for_settling in _lib.lua): a snooze that comes late, after
-- a newer run of the task started, is left out.
--
-- KEYS[1] -> rtq:{<queue>}:active
-- KEYS[2] -> rtq:{<queue>}:owner
-- KEYS[3] -> rtq:{<queue>}:state
-- KEYS[4] -> rtq:{<queue>}:info
-- KEYS[5] -> rtq:{<queue>}:scheduled
-- KEYS[6] -> rtq:{<queue>}:runs
-- KEYS[7] -> rtq:{<queue>}:unstarted
-- KEYS[8] -> rtq:{<queue>}:pending
-- KEYS[9] -> rtq:{<queue>}:retry
-- KEYS[10] -> rtq:{<queue>}:slots
-- KEYS[11] -> rtq:{<queue>}:running
-- KEYS[12] -> rtq:{<queue>}:began
-- KEYS[13] -> rtq:{<queue>}:holds
-- KEYS[14] -> rtq:{<queue>}:snoozed:<day>
-- ARGV[1] -> now (ms; 0 = the server's clock)
-- ARGV[2] -> task id
-- ARGV[3] -> worker id that ran it
-- ARGV[4] -> run number (from its claim)
-- ARGV[5] -> delay (ms)
-- ARGV[6] -> info JSON
-- ARGV[7] -> the task type to hold until then ("" = none)
-- ARGV[8] -> counter TTL (s)
-- ARGV[9] -> wake channel (published to when a freed concurrency slot may let a task start)
--
-- Returns: when the task is due (ms); 0 when the snooze came late.
local now, id, worker, run = clock_now(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]
local delay, info_json, hold, counter_ttl = tonumber(ARGV[5]), ARGV[6], ARGV[7], ARGV[8]
local t = {
  active = KEYS[1], owner = KEYS[2], state = KEYS[3], runs = KEYS[6], unstarted = KEYS[7],
  pending = KEYS[8], retry = KEYS[9], slots = KEYS[10], running = KEYS[11], began = KEYS[12],
}
local scheduled, holds = KEYS[5], KEYS[13]

-- Checked before anything changes: a script that fails half-way keeps what it wrote.
if hold ~= '' then
  local kind = redis.call('TYPE', holds).ok
  if kind ~= 'hash' and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE the snooze holds key ' .. holds .. ' holds a ' .. kind .. ', not a hash')
  end
end
if not take_for_settling(t, id, worker, run) then return 0 end
local due = now + delay
redis.call('HSET', KEYS[4], id, info_json)
redis.call('HSET', t.state, id, 'scheduled')
redis.call('ZADD', scheduled, due, id)
if hold ~= '' and (tonumber(redis.call('HGET', holds, hold)) or 0) < due then
  redis.call('HSET', holds, hold, due)
end
bump_counter(KEYS[14], counter_ttl)
wake_freed(t, t.pending, ARGV[9])
return due
