-- Compare-and-set of a compaction result.
-- KEYS[1] the thread hash; KEYS[2..] the thread's other keys (TTL refresh).
-- ARGV: expected gen, folded ids (JSON array, oldest first), summary, notes JSON,
--       lastCompactedAt, ttl seconds.
-- Applies only if summary, pins and notes are still those read (gen unchanged) and
-- the folded messages are still the oldest ones, in order.  Removes exactly those,
-- keeps every message appended meanwhile.  The person's pins are never written here.
-- Pins stored by a model before notes existed are dropped: they were read as notes.
-- Returns {'applied', version, kept count} or {'stale', reason}.
if redis.call('EXISTS', KEYS[1]) == 0 then return {'stale', 'missing'} end
local gen = redis.call('HGET', KEYS[1], 'gen') or '0'
if gen ~= ARGV[1] then return {'stale', 'generation'} end
local raw = redis.call('HGET', KEYS[1], 'messages') or '[]'
local messages = {}
if raw ~= '[]' then messages = cjson.decode(raw) end
local folded = cjson.decode(ARGV[2])
if #folded == 0 or #folded > #messages then return {'stale', 'messages'} end
for i = 1, #folded do
  if messages[i]['id'] ~= folded[i] then return {'stale', 'messages'} end
end
local kept = {}
for i = #folded + 1, #messages do kept[#kept + 1] = cjson.encode(messages[i]) end
local pins_raw = redis.call('HGET', KEYS[1], 'pins') or '[]'
if string.find(pins_raw, '"by":"model"', 1, true) then
  local person = {}
  for _, pin in ipairs(cjson.decode(pins_raw)) do
    if pin['by'] == 'person' then person[#person + 1] = cjson.encode(pin) end
  end
  redis.call('HSET', KEYS[1], 'pins', '[' .. table.concat(person, ',') .. ']')
end
redis.call('HSET', KEYS[1], 'messages', '[' .. table.concat(kept, ',') .. ']',
  'summary', ARGV[3], 'notes', ARGV[4], 'lastCompactedAt', ARGV[5])
redis.call('HINCRBY', KEYS[1], 'gen', 1)
local version = redis.call('HINCRBY', KEYS[1], 'v', 1)
local ttl = tonumber(ARGV[6])
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
return {'applied', version, #kept}
