-- Forget turns of a thread everywhere the thread's keys hold them (docs/memory.md: "Forget and provenance";
-- docs/contract.md: Forget), compare-and-set on the generation like apply_compaction.lua.  One call forgets every
-- turn of one request (one write, however many turns).
-- KEYS[1] the thread hash; KEYS[2..] the thread's other keys (TTL refresh): KEYS[3] the compaction history
--   list, KEYS[4] the feedback list, the last key the archive (a sorted set scored by turn number).
-- ARGV: expected gen, turn numbers (JSON array, none forgotten before), ids of the turns' recent messages (JSON
--       array), "1" to write the record / "0" to keep it, the record (stored form, app.memory.record), notes JSON,
--       history entries (JSON array of JSON texts, one a turn), most history entries kept, ttl seconds, ids of all
--       the turns' messages (JSON array: the feedback on them goes, its reason may quote the turn).
-- Applies only while gen is unchanged (the record and notes were computed from what was read).  Removes the
-- messages with those ids (a turn committed meanwhile stays), every archive member scored by one of the turns (and
-- their bytes from `ab`), writes record and notes, adds the turns to `fgt` (forgotten turns, JSON array), moves
-- `fg` (turns forgotten so far: a turn in flight that read another value commits nothing, commit_turn.lua) on by
-- the number of turns new to `fgt`, `gen` and `v` by one, and pushes the history entries.  A compaction or
-- refinement that read the thread before can no longer apply (gen moved on).
-- Returns {1, version, recent messages removed, archive members removed, fg} or {0, reason}.
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 'missing'} end
local gen = redis.call('HGET', KEYS[1], 'gen') or '0'
if gen ~= ARGV[1] then return {0, 'generation'} end
local turns = cjson.decode(ARGV[2])
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
local gone_members, gone_bytes = 0, 0
for _, turn in ipairs(turns) do
  local members = redis.call('ZRANGEBYSCORE', archive, turn, turn)
  for _, member in ipairs(members) do gone_bytes = gone_bytes + #member end
  if #members > 0 then
    redis.call('ZREMRANGEBYSCORE', archive, turn, turn)
    gone_members = gone_members + #members
  end
end
local bytes = tonumber(redis.call('HGET', KEYS[1], 'ab') or '0') - gone_bytes
if bytes < 0 then bytes = 0 end
local forgotten, seen = {}, {}
local fgt = redis.call('HGET', KEYS[1], 'fgt')
if fgt then
  for _, n in ipairs(cjson.decode(fgt)) do
    forgotten[#forgotten + 1] = n
    seen[n] = true
  end
end
local new = 0
for _, turn in ipairs(turns) do
  if not seen[turn] then
    forgotten[#forgotten + 1] = turn
    seen[turn] = true
    new = new + 1
  end
end
redis.call('HSET', KEYS[1], 'messages', '[' .. table.concat(kept, ',') .. ']', 'notes', ARGV[6],
  'ab', bytes, 'fgt', cjson.encode(forgotten))
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'summary', ARGV[5]) end
local turn_ids = {}
for _, id in ipairs(cjson.decode(ARGV[10])) do turn_ids[id] = true end
for _, item in ipairs(redis.call('LRANGE', KEYS[4], 0, -1)) do
  local ok, entry = pcall(cjson.decode, item)
  if ok and type(entry) == 'table' and turn_ids[entry['messageId']] then redis.call('LREM', KEYS[4], 0, item) end
end
for _, entry in ipairs(cjson.decode(ARGV[7])) do redis.call('LPUSH', KEYS[3], entry) end
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[8]) - 1)
local fg = redis.call('HINCRBY', KEYS[1], 'fg', new)
redis.call('HINCRBY', KEYS[1], 'gen', 1)
local version = redis.call('HINCRBY', KEYS[1], 'v', 1)
local ttl = tonumber(ARGV[9])
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
return {1, version, removed, gone_members, fg}
