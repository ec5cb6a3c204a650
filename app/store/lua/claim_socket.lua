-- Claim, renew or release one websocket's lease in its session's set (WS_MAX_PER_SESSION).
-- KEYS[1] the session's socket set (sorted set: socket id -> lease end, Redis ms).
-- ARGV: 'claim' | 'renew' | 'release', socket id, lease ms, most sockets (claim only).
-- Leases that ended are dropped first, so a socket of a process that died frees its place
-- within one lease.  A renewal puts the lease back even when it had gone (a restarted Redis).
-- Returns 1 when claimed, renewed or released; 0 when the set is full (claim).
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local lease = tonumber(ARGV[3])
if ARGV[1] == 'release' then
  redis.call('ZREM', KEYS[1], ARGV[2])
  return 1
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
if ARGV[1] == 'claim' and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], ms + lease, ARGV[2])
redis.call('PEXPIRE', KEYS[1], lease)
return 1
