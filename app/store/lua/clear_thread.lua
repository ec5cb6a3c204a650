-- Empty a thread atomically (docs/contract.md: HTTP, DELETE /api/chat/thread); works on a corrupt thread too.
-- KEYS[1] the thread hash; KEYS[2..] the thread's other keys (deleted), the archive of folded turns included.
-- The hash is rewritten whole, so `ft` (turns folded) and `ab` (archive bytes) start again.
-- ARGV[1] ttl seconds.  Version and generation move on, so a compaction that read
-- the old generation can never apply afterwards; the clear counter `clr` moves on too
-- (it stays in the hash), so a turn that read the thread before cannot commit into it
-- (commit_turn.lua).  Nothing can fail half way: the counters are read and checked
-- before anything is written.  A counter that is not a non-negative integer (a corrupt
-- or tampered hash, which no reader accepts) restarts from the largest valid one, and a
-- key that is not a hash is replaced; every other field is rewritten anyway.
-- Returns {new version, 1 if something corrupt was repaired else 0}.
local function counter(value)
  if type(value) == 'string' and string.match(value, '^%d+$') and #value <= 12 then return tonumber(value) end
  return nil
end
local repaired = 0
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'hash' and kind ~= 'none' then
  redis.call('DEL', KEYS[1])
  repaired = 1
end
local now = redis.call('HMGET', KEYS[1], 'gen', 'clr', 'v')
local base = 0
for i = 1, 3 do
  local n = counter(now[i])
  if n then
    if n > base then base = n end
  elseif now[i] then
    repaired = 1
  end
end
local function next_value(value)
  if not value then return 1 end  -- absent: as HINCRBY would count it
  return (counter(value) or base) + 1
end
local gen, clr, version = next_value(now[1]), next_value(now[2]), next_value(now[3])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'gen', gen, 'clr', clr, 'v', version,
  'messages', '[]', 'summary', '', 'pins', '[]', 'notes', '[]')
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
for i = 2, #KEYS do redis.call('DEL', KEYS[i]) end
return {version, repaired}
