-- Replace the pinned decisions and the model's notes together when they are still those read
-- (the person promotes a note to a pinned decision, or removes a note).
-- KEYS[1] the thread hash; KEYS[2..] the thread's other keys (TTL refresh).
-- ARGV: expected gen, pins JSON, notes JSON, ttl seconds.  Returns {1, version} or {0, 'stale'}.
-- A clear bumps gen, so a request that read the thread before a clear writes nothing.
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 'stale'} end
local gen = redis.call('HGET', KEYS[1], 'gen') or '0'
if gen ~= ARGV[1] then return {0, 'stale'} end
redis.call('HSET', KEYS[1], 'pins', ARGV[2], 'notes', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'gen', 1)
local version = redis.call('HINCRBY', KEYS[1], 'v', 1)
local ttl = tonumber(ARGV[4])
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
return {1, version}
