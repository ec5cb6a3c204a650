-- Empty a thread atomically (docs/contract.md: HTTP, DELETE /api/chat/thread).
-- KEYS[1] the thread hash; KEYS[2..] the thread's other keys (deleted), the archive of folded turns included.
-- ARGV[1] ttl seconds.  Version and generation move on, so a compaction that read
-- the old generation can never apply afterwards; the clear counter `clr` moves on too
-- (it stays in the hash), so a turn that read the thread before cannot commit into it
-- (commit_turn.lua).  Returns the new version.
local gen = redis.call('HINCRBY', KEYS[1], 'gen', 1)
redis.call('HINCRBY', KEYS[1], 'clr', 1)
local version = redis.call('HINCRBY', KEYS[1], 'v', 1)
redis.call('HSET', KEYS[1], 'messages', '[]', 'summary', '', 'pins', '[]', 'notes', '[]')
redis.call('HDEL', KEYS[1], 'lastCompactedAt', 'ft', 'ab')  -- turn numbers and the archive start again
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
for i = 2, #KEYS do redis.call('DEL', KEYS[i]) end
return version
