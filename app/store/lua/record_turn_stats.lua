-- Add one turn's accounting record to its thread's capped stats list, only while the thread exists.
-- KEYS[1] the thread's state hash (mem:{hex}), KEYS[2] its stats list (mem:{hex}:stats).
-- ARGV: the record (JSON), most records kept, TTL seconds.
-- A turn of a thread that was never written (a cancelled or unsaved first turn) leaves no key:
-- the statistics live with the thread or not at all.  Returns 1 when stored, 0 when not.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('LPUSH', KEYS[2], ARGV[1])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
return 1
