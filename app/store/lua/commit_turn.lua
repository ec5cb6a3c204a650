-- Commit one final turn atomically (docs/memory.md: A turn; docs/contract.md: the done frame).
-- KEYS[1] the thread hash; KEYS[2..] the thread's other keys (TTL refresh).
-- ARGV: user message JSON, assistant message JSON, user id, assistant id,
--       user text, assistant text, dedupe-by-text ("1"/"0"), ttl seconds,
--       the clear counter read when the turn started ('' = not known: no check),
--       the hard cap on stored messages ('' or 0 = none),
--       the forget counter read when the turn started ('' = not known: no check).
-- Returns {appended (1|0), version, message count}, or {0, version, message count, refusal} with refusal:
--   'cleared'      the thread was cleared since the turn started (clear_thread.lua bumps `clr`): a clear
--                  is final for every turn that started before it;
--   'forgotten'    a turn of the thread was forgotten since the turn started (forget_turn.lua bumps `fg`): a
--                  forget is final too, and the answer may quote what the turn read of the forgotten turn;
--   'id_conflict'  a stored message has the user id with a different text (the same id with the same
--                  text is the same turn again: a duplicate, {0, version, count});
--   'full'         the thread holds so many messages that this pair would pass the hard cap (the worker's
--                  folds are behind or failing); nothing is written.
local function count_of(raw)
  if raw and raw ~= '[]' then return #cjson.decode(raw) end
  return 0
end
if ARGV[9] and ARGV[9] ~= '' and (redis.call('HGET', KEYS[1], 'clr') or '0') ~= ARGV[9] then
  local now = redis.call('HGET', KEYS[1], 'messages') or '[]'
  return {0, tonumber(redis.call('HGET', KEYS[1], 'v') or '0'), count_of(now), 'cleared'}
end
if ARGV[11] and ARGV[11] ~= '' and (redis.call('HGET', KEYS[1], 'fg') or '0') ~= ARGV[11] then
  local now = redis.call('HGET', KEYS[1], 'messages') or '[]'
  return {0, tonumber(redis.call('HGET', KEYS[1], 'v') or '0'), count_of(now), 'forgotten'}
end
local raw = redis.call('HGET', KEYS[1], 'messages')
local messages = {}
if raw and raw ~= '[]' then messages = cjson.decode(raw) end
local n = #messages
local version = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
local duplicate = false
for i = 1, n do
  local id = messages[i]['id']
  if id == ARGV[3] then
    if messages[i]['text'] ~= ARGV[5] then return {0, version, n, 'id_conflict'} end
    duplicate = true
    break
  end
  if id == ARGV[4] then duplicate = true break end
end
if not duplicate and ARGV[7] == '1' and n >= 2 then
  local u, a = messages[n - 1], messages[n]
  if u['role'] == 'user' and a['role'] == 'assistant' and u['text'] == ARGV[5] and a['text'] == ARGV[6] then
    duplicate = true
  end
end
if duplicate then return {0, version, n} end
local cap = tonumber(ARGV[10] or '') or 0
if cap > 0 and n + 2 > cap then return {0, version, n, 'full'} end
local pair = ARGV[1] .. ',' .. ARGV[2]
local out
if n == 0 then out = '[' .. pair .. ']' else out = string.sub(raw, 1, -2) .. ',' .. pair .. ']' end
version = redis.call('HINCRBY', KEYS[1], 'v', 1)
redis.call('HSET', KEYS[1], 'messages', out)
-- The thread's creation stamp (the server's clock in microseconds and the first turn's answer id): a thread that
-- expired and began again gets another, so no process serves the new conversation from a cache of the old one
-- (app/store/archive.py).
if redis.call('HEXISTS', KEYS[1], 'born') == 0 then
  local now = redis.call('TIME')
  redis.call('HSET', KEYS[1], 'born', now[1] .. '.' .. now[2] .. ':' .. ARGV[4])
end
local ttl = tonumber(ARGV[8])
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
return {1, version, n + 2}
