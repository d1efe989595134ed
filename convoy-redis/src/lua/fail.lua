-- Records a failed attempt at a unit's head entry, beside the lease, so a
-- failover or restart does not reset the count; halts the unit once the
-- retries are used up, or at once when the failure is one no retry can
-- mend.
--
-- KEYS[1] lease, KEYS[2] unit state hash, KEYS[3] the owner's liveness key
-- ARGV[1] fence token, ARGV[2] entry id ('' for a fault of the unit
-- itself), ARGV[3] error text, ARGV[4] max retries, ARGV[5] now (ms),
-- ARGV[6] the failures the caller knew of before this one (so a call
-- repeated after a lost reply counts the failure once), ARGV[7] the
-- owner's incarnation, ARGV[8] the halt reason when it must halt at once
-- ('' to retry as usual)
--
-- Returns {refusal} (see fence.lua) when fenced out, else
-- {1, failures, halted (0/1)}.
local no = refusal(KEYS[1], ARGV[1], KEYS[#KEYS], ARGV[7])
if no then
  return {no}
end
if redis.call('HGET', KEYS[2], 'head') ~= ARGV[2] then
  redis.call('HSET', KEYS[2], 'head', ARGV[2], 'attempts', 0)
end
local failures = tonumber(redis.call('HGET', KEYS[2], 'attempts') or '0')
if failures <= tonumber(ARGV[6]) then
  failures = redis.call('HINCRBY', KEYS[2], 'attempts', 1)
end
redis.call('HSET', KEYS[2], 'last_error', ARGV[3])
local reason = ARGV[8]
if reason == '' and failures > tonumber(ARGV[4]) then
  reason = 'max_retries exceeded'
end
if reason ~= '' then
  redis.call('HSET', KEYS[2], 'halted', '1', 'halt_reason', reason,
    'halt_error', ARGV[3], 'halt_since', ARGV[5], 'halt_entry', ARGV[2])
  return {1, failures, 1}
end
return {1, failures, 0}
