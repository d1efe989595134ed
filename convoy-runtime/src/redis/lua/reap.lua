-- Retires a drained, idle unit: its index entry and its empty streams (both
-- lanes) go together, with its lease. The generation counter in the state
-- hash stays, so fences remain monotonic if the key comes back.
--
-- KEYS[1] lease, KEYS[2] partition index, KEYS[3] primary stream,
-- KEYS[4] backfill stream, KEYS[5] unit state hash, KEYS[6] the owner's
-- liveness key
-- ARGV[1] fence token, ARGV[2] partition key, ARGV[3] idle time (ms),
-- ARGV[4] now (ms)
--
-- Returns -1 when the lease is not held with this token, 0 when the unit is
-- not empty or not idle long enough, 1 when retired.
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('EXISTS', KEYS[#KEYS]) == 0 then
  return -1
end
if redis.call('XLEN', KEYS[3]) > 0 or redis.call('XLEN', KEYS[4]) > 0 then
  return 0
end
local active = tonumber(redis.call('HGET', KEYS[5], 'active') or '0')
if tonumber(ARGV[4]) - active < tonumber(ARGV[3]) then
  return 0
end
redis.call('DEL', KEYS[3], KEYS[4], KEYS[1])
redis.call('SREM', KEYS[2], ARGV[2])
return 1
