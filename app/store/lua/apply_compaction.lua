-- Compare-and-set of a compaction result, and the archive of the folded turns.
-- KEYS[1] the thread hash; KEYS[2..] the thread's other keys (TTL refresh); the last key is the archive
--   (a sorted set, ThreadKeys.archive).
-- ARGV: expected gen, folded ids (JSON array, oldest first), summary, notes JSON,
--       lastCompactedAt, ttl seconds, archive max turns, archive max bytes.
-- Applies only if summary, pins and notes are still those read (gen unchanged) and
-- the folded messages are still the oldest ones, in order.  Removes exactly those,
-- keeps every message appended meanwhile.  The person's pins are never written here.
-- Pins stored by a model before notes existed are dropped: they were read as notes.
-- Every folded turn (a person message and the answers after it) goes into the archive as
-- {"n": turn number, "m": [messages]}, scored by its number: the numbers go on from `ft` (person
-- turns folded before), which moves on by the folded person turns.  The archive keeps at most the
-- newest max-turns turns and max-bytes bytes (`ab`), oldest out; the newest turn always stays.
-- Each applied fold counts one more fold without the model's refinement (`uf`, reset by apply_refinement.lua).
-- Returns {'applied', version, kept count, archived turns, archive size, folds since the last refinement,
-- person turns folded so far, first and last turn number the cap dropped (0, 0: none)} or {'stale', reason}.
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
-- the archive
local archive = KEYS[#KEYS]
local number = tonumber(redis.call('HGET', KEYS[1], 'ft') or '0')
local added_bytes, added = 0, 0
local turn = nil
local function flush()
  if turn == nil then return end
  local member = cjson.encode({n = number, m = turn})
  redis.call('ZADD', archive, number, member)
  added_bytes = added_bytes + #member
  added = added + 1
end
for i = 1, #folded do
  local message = messages[i]
  if message['role'] == 'user' or turn == nil then
    flush()
    if message['role'] == 'user' then number = number + 1 end
    turn = {message}
  else
    turn[#turn + 1] = message
  end
end
flush()
local count = redis.call('ZCARD', archive)
local bytes
if count == added then bytes = added_bytes else bytes = tonumber(redis.call('HGET', KEYS[1], 'ab') or '0') + added_bytes end
local max_turns, max_bytes = tonumber(ARGV[7]), tonumber(ARGV[8])
local dropped_first, dropped_last = 0, 0
while count > 1 and (count > max_turns or bytes > max_bytes) do
  local oldest = redis.call('ZPOPMIN', archive, 1)
  bytes = bytes - #oldest[1]
  count = count - 1
  local score = tonumber(oldest[2])
  if dropped_first == 0 then dropped_first = score end
  dropped_last = score
end
redis.call('HSET', KEYS[1], 'messages', '[' .. table.concat(kept, ',') .. ']',
  'summary', ARGV[3], 'notes', ARGV[4], 'lastCompactedAt', ARGV[5], 'ft', number, 'ab', bytes)
redis.call('HINCRBY', KEYS[1], 'gen', 1)
local unrefined = redis.call('HINCRBY', KEYS[1], 'uf', 1)
local version = redis.call('HINCRBY', KEYS[1], 'v', 1)
local ttl = tonumber(ARGV[6])
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
return {'applied', version, #kept, added, count, unrefined, number, dropped_first, dropped_last}
