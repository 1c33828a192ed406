-- Drop records from the mirror buffer once they are in the ORM: each only if it is still the
-- record that was written (its SHA-1 matches), since a task run again may have replaced it.
-- Safe whoever holds the lock, and however often it runs.
--
-- KEYS[1] -> rtq:{<queue>}:mirror_lock
-- KEYS[2] -> rtq:{<queue>}:finished
-- ARGV[1] -> worker id
-- ARGV[2] -> 1 to release the lock if this worker holds it, 0 to keep it
-- ARGV[3..] -> two per task: its id, the SHA-1 (hex) of the record that was mirrored
--
-- Returns: the number of records dropped.
local lock, finished = KEYS[1], KEYS[2]
local worker, release = ARGV[1], ARGV[2] == '1'

local dropped = 0
for i = 3, #ARGV, 2 do
  local record = redis.call('HGET', finished, ARGV[i])
  if record and redis.sha1hex(record) == ARGV[i + 1] then
    redis.call('HDEL', finished, ARGV[i])
    dropped = dropped + 1
  end
end
if release and redis.call('GET', lock) == worker then redis.call('DEL', lock) end
return dropped
