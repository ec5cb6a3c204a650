-- Record one compaction history entry when the thread exists, with the thread's remaining TTL.
-- KEYS[1] the thread hash; KEYS[2] the history list.
-- ARGV: entry JSON, most entries kept, ttl seconds (when the thread has no TTL), the clear counter the work read
-- ('' : not checked).
-- Returns 1 when recorded, 0 when the thread does not exist or was cleared since the work read it.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[4] ~= nil and ARGV[4] ~= '' and (redis.call('HGET', KEYS[1], 'clr') or '0') ~= ARGV[4] then return 0 end
redis.call('LPUSH', KEYS[2], ARGV[1])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
local ttl = redis.call('TTL', KEYS[1])
if ttl > 0 then redis.call('EXPIRE', KEYS[2], ttl) else redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3])) end
return 1
