-- Replace the pinned decisions when they are still those read (a person's pin or unpin).
-- KEYS[1] the thread hash; KEYS[2..] the thread's other keys (TTL refresh).
-- ARGV: expected gen, pins JSON, ttl seconds.  Returns {1, version} or {0, 'stale'}.
local gen = redis.call('HGET', KEYS[1], 'gen') or '0'
if gen ~= ARGV[1] then return {0, 'stale'} end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'messages', '[]', 'summary', '')
end
redis.call('HSET', KEYS[1], 'pins', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'gen', 1)
local version = redis.call('HINCRBY', KEYS[1], 'v', 1)
local ttl = tonumber(ARGV[3])
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
return {1, version}
