-- Tell whether a queue is in use, and forget one nothing has used for a while. In use: one of
-- KEYS[4..21] exists (tasks in any state, work under way, a pause), a live worker waits on it
-- (idle) or it applied a command lately (applied). While unused, the first call notes since
-- when (empty_since); once that is `grace` ms ago, the call deletes the queue's leftover keys
-- (KEYS[22..], and the note): the caller then takes it out of the registry. With a negative
-- grace it only tells, writing nothing. A use clears the note.
--
-- KEYS[1] -> rtq:{<queue>}:empty_since
-- KEYS[2] -> rtq:{<queue>}:idle
-- KEYS[3] -> rtq:{<queue>}:applied
-- KEYS[4] -> rtq:{<queue>}:pending
-- KEYS[5] -> rtq:{<queue>}:active
-- KEYS[6] -> rtq:{<queue>}:scheduled
-- KEYS[7] -> rtq:{<queue>}:retry
-- KEYS[8] -> rtq:{<queue>}:archived
-- KEYS[9] -> rtq:{<queue>}:completed
-- KEYS[10] -> rtq:{<queue>}:waiting
-- KEYS[11] -> rtq:{<queue>}:state
-- KEYS[12] -> rtq:{<queue>}:msg
-- KEYS[13] -> rtq:{<queue>}:held
-- KEYS[14] -> rtq:{<queue>}:parked
-- KEYS[15] -> rtq:{<queue>}:unstarted
-- KEYS[16] -> rtq:{<queue>}:commands
-- KEYS[17] -> rtq:{<queue>}:command
-- KEYS[18] -> rtq:{<queue>}:finished
-- KEYS[19] -> rtq:{<queue>}:bulk
-- KEYS[20] -> rtq:{<queue>}:outboxed
-- KEYS[21] -> rtq:{<queue>}:paused
-- KEYS[22] -> rtq:{<queue>}:seq
-- KEYS[23] -> rtq:{<queue>}:timings
-- KEYS[24] -> rtq:{<queue>}:periodic
-- KEYS[25] -> rtq:{<queue>}:parked_kinds
-- KEYS[26] -> rtq:{<queue>}:buckets
-- KEYS[27] -> rtq:{<queue>}:running
-- KEYS[28] -> rtq:{<queue>}:slots
-- KEYS[29] -> rtq:{<queue>}:info
-- KEYS[30] -> rtq:{<queue>}:result
-- KEYS[31] -> rtq:{<queue>}:owner
-- KEYS[32] -> rtq:{<queue>}:priority
-- KEYS[33] -> rtq:{<queue>}:runs
-- KEYS[34] -> rtq:{<queue>}:progress
-- KEYS[35] -> rtq:{<queue>}:began
-- KEYS[36] -> rtq:{<queue>}:holds
-- KEYS[37] -> rtq:{<queue>}:lanes
-- KEYS[38] -> rtq:{<queue>}:vclock
-- ARGV[1] -> now (ms; 0 = the server's clock)
-- ARGV[2] -> grace (ms): how long it must have been unused to be forgotten; negative: only tell
-- ARGV[3] -> how long (ms) an applied command is remembered (APPLIED_TTL_MS)
--
-- Returns: {0, the name of what uses it (a key's last part)}; {1} unused, not (yet) forgotten;
-- {2} forgotten: its leftovers deleted.
local empty_since, idle, applied = KEYS[1], KEYS[2], KEYS[3]
local IN_USE_FIRST, IN_USE_LAST = 4, 21
local now = clock_now(ARGV[1])
local grace, applied_ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local only_tell = grace < 0

local function last_part(key) return string.match(key, '([^:]+)$') end

local user = nil
for i = IN_USE_FIRST, IN_USE_LAST do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    user = last_part(KEYS[i])
    break
  end
end
if not user and redis.call('ZCOUNT', idle, '(' .. now, '+inf') > 0 then user = last_part(idle) end
if not user and redis.call('ZCOUNT', applied, '(' .. (now - applied_ttl), '+inf') > 0 then
  user = last_part(applied)
end
if user then
  if not only_tell then redis.call('DEL', empty_since) end
  return {0, user}
end
if only_tell then return {1} end

local since = tonumber(redis.call('GET', empty_since))
if not since then
  redis.call('SET', empty_since, now)
  since = now
end
if now - since < grace then return {1} end
redis.call('DEL', empty_since, idle, applied)
for i = IN_USE_LAST + 1, #KEYS do redis.call('DEL', KEYS[i]) end
return {2}
