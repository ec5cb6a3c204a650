-- Store one feedback entry, replacing the same message's earlier entry (app/store/feedback_store.py).
-- KEYS[1] the thread's feedback list (mem:{hex}:feedback).
-- ARGV[1] entry JSON, ARGV[2] its message id, ARGV[3] cap (entries kept), ARGV[4] TTL seconds.
-- Returns the list's length after the push and the trim.
local items = redis.call('LRANGE', KEYS[1], 0, -1)
for i = 1, #items do
  local ok, entry = pcall(cjson.decode, items[i])
  if ok and type(entry) == 'table' and entry['messageId'] == ARGV[2] then
    redis.call('LREM', KEYS[1], 0, items[i])
  end
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[3]) - 1)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
return redis.call('LLEN', KEYS[1])
