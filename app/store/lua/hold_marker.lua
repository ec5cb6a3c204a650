-- Hold the pending-compaction marker for the task that runs (or waits to retry) the compaction it guards:
-- when the marker still holds the task's version, or is gone (it expired while the task was queued), set it
-- to that version with a new expiry.  A marker holding another version (a newer request) is left alone.
-- KEYS[1] the marker; ARGV[1] the version; ARGV[2] the expiry in seconds.  Returns 1 when held, else 0.
local current = redis.call('GET', KEYS[1])
if current == false or current == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
  return 1
end
return 0
