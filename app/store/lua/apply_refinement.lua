-- Compare-and-set of a refinement: the model's gist and notes for turns already folded (docs/memory.md: A compaction).
-- KEYS[1] the thread hash; KEYS[2..] the thread's other keys (TTL refresh).
-- ARGV: expected gen, turns refined up to (the `ft` read), summary, notes JSON, ttl seconds.
-- Applies only if the generation is unchanged (no fold, pin change, clear or other refinement since the read):
-- writes summary and notes, sets `rf` (turns refined so far) and `uf` (folds since the last refinement) to 0,
-- and moves `gen` and `v` on.  Messages and the archive are never touched.
-- Returns {'applied', version} or {'stale', reason}.
if redis.call('EXISTS', KEYS[1]) == 0 then return {'stale', 'missing'} end
if (redis.call('HGET', KEYS[1], 'gen') or '0') ~= ARGV[1] then return {'stale', 'generation'} end
redis.call('HSET', KEYS[1], 'summary', ARGV[3], 'notes', ARGV[4], 'rf', ARGV[2], 'uf', 0)
redis.call('HINCRBY', KEYS[1], 'gen', 1)
local version = redis.call('HINCRBY', KEYS[1], 'v', 1)
local ttl = tonumber(ARGV[5])
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
return {'applied', version}
