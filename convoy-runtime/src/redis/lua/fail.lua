-- Records a failed attempt at a unit's head entry, beside the lease, so a
-- failover or restart does not reset the count; halts the unit once the
-- retries are used up.
--
-- KEYS[1] lease, KEYS[2] unit state hash, KEYS[3] the owner's liveness key
-- ARGV[1] fence token, ARGV[2] entry id, ARGV[3] error text,
-- ARGV[4] max retries, ARGV[5] now (ms)
--
-- Returns {-1} when the lease is not held with this token, else
-- {failures, halted (0/1)}.
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('EXISTS', KEYS[#KEYS]) == 0 then
  return {-1}
end
if redis.call('HGET', KEYS[2], 'head') ~= ARGV[2] then
  redis.call('HSET', KEYS[2], 'head', ARGV[2], 'attempts', 0)
end
local failures = redis.call('HINCRBY', KEYS[2], 'attempts', 1)
redis.call('HSET', KEYS[2], 'last_error', ARGV[3])
if failures > tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[2], 'halted', '1', 'halt_reason',
    'max_retries exceeded', 'halt_error', ARGV[3], 'halt_since', ARGV[5],
    'halt_entry', ARGV[2])
  return {failures, 1}
end
return {failures, 0}
