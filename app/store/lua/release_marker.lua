-- Release the pending-compaction marker only when it still holds the version the task was
-- enqueued with (a newer request's marker is left alone).
-- KEYS[1] the marker; ARGV[1] the version.  Returns 1 when released, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
