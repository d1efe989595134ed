-- Retires a drained, idle unit: its index entries and its empty streams
-- (both lanes of every category it spans) go together, with its lease. The
-- generation counter in the state hash stays, so fences remain monotonic if
-- the key comes back.
--
-- KEYS[1] lease, KEYS[2] unit state hash,
-- KEYS[3i .. 3i+2] for category i in 1..n: its partition index, the unit's
-- primary stream there and its backfill stream,
-- KEYS[3n+3] the owner's liveness key
-- ARGV[1] fence token, ARGV[2] partition key (correlation value),
-- ARGV[3] idle time (ms), ARGV[4] now (ms), ARGV[5] n,
-- ARGV[6] the owner's incarnation
--
-- Returns {refusal} (see fence.lua) when fenced out, {0} when the unit is
-- not empty or not idle long enough, {1} when retired.
local no = refusal(KEYS[1], ARGV[1], KEYS[#KEYS], ARGV[6])
if no then
  return {no}
end
local n = tonumber(ARGV[5])
for i = 1, n do
  if redis.call('XLEN', KEYS[3 * i + 1]) > 0 or redis.call('XLEN', KEYS[3 * i + 2]) > 0 then
    return {0}
  end
end
local active = tonumber(redis.call('HGET', KEYS[2], 'active') or '0')
if tonumber(ARGV[4]) - active < tonumber(ARGV[3]) then
  return {0}
end
for i = 1, n do
  redis.call('DEL', KEYS[3 * i + 1], KEYS[3 * i + 2])
  redis.call('SREM', KEYS[3 * i], ARGV[2])
end
redis.call('DEL', KEYS[1])
return {1}
