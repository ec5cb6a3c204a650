-- Forget one turn of a thread everywhere the thread's keys hold it (README: "Forget and provenance";
-- docs/contract.md: Forget), compare-and-set on the generation like apply_compaction.lua.
-- KEYS[1] the thread hash; KEYS[2..] the thread's other keys (TTL refresh): KEYS[3] the compaction history
--   list, the last key the archive (a sorted set scored by turn number).
-- ARGV: expected gen, turn number, ids of the turn's recent messages (JSON array), "1" to write the record /
--       "0" to keep it, the record (stored form, app.memory.record), notes JSON, history entry JSON,
--       most history entries kept, ttl seconds.
-- Applies only while gen is unchanged (the record and notes were computed from what was read).  Removes the
-- messages with those ids (a turn committed meanwhile stays), every archive member scored by the turn (and
-- their bytes from `ab`), writes record and notes, adds the turn to `fgt` (forgotten turns, JSON array),
-- moves `fg` (forgets so far, part of every process's archive cache key), `gen` and `v` on, and pushes the
-- history entry.  A compaction or refinement that read the thread before can no longer apply (gen moved on).
-- Returns {1, version, recent messages removed, archive members removed} or {0, reason}.
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 'missing'} end
local gen = redis.call('HGET', KEYS[1], 'gen') or '0'
if gen ~= ARGV[1] then return {0, 'generation'} end
local turn = tonumber(ARGV[2])
local drop = {}
for _, id in ipairs(cjson.decode(ARGV[3])) do drop[id] = true end
local raw = redis.call('HGET', KEYS[1], 'messages') or '[]'
local kept, removed = {}, 0
if raw ~= '[]' then
  for _, message in ipairs(cjson.decode(raw)) do
    if drop[message['id']] then removed = removed + 1 else kept[#kept + 1] = cjson.encode(message) end
  end
end
local archive = KEYS[#KEYS]
local members = redis.call('ZRANGEBYSCORE', archive, turn, turn)
local gone_bytes = 0
for _, member in ipairs(members) do gone_bytes = gone_bytes + #member end
if #members > 0 then redis.call('ZREMRANGEBYSCORE', archive, turn, turn) end
local bytes = tonumber(redis.call('HGET', KEYS[1], 'ab') or '0') - gone_bytes
if bytes < 0 then bytes = 0 end
local forgotten = {}
local fgt = redis.call('HGET', KEYS[1], 'fgt')
local seen = false
if fgt then
  for _, n in ipairs(cjson.decode(fgt)) do
    forgotten[#forgotten + 1] = n
    if n == turn then seen = true end
  end
end
if not seen then forgotten[#forgotten + 1] = turn end
redis.call('HSET', KEYS[1], 'messages', '[' .. table.concat(kept, ',') .. ']', 'notes', ARGV[6],
  'ab', bytes, 'fgt', cjson.encode(forgotten))
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'summary', ARGV[5]) end
redis.call('LPUSH', KEYS[3], ARGV[7])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[8]) - 1)
redis.call('HINCRBY', KEYS[1], 'fg', 1)
redis.call('HINCRBY', KEYS[1], 'gen', 1)
local version = redis.call('HINCRBY', KEYS[1], 'v', 1)
local ttl = tonumber(ARGV[9])
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
return {1, version, removed, #members}
