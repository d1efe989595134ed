-- Saves a process-manager instance with optimistic concurrency.
--
-- KEYS[1] the instance hash `convoy:pm:{process manager}:{correlation value}`
-- ARGV[1] the version the caller loaded (0 for a new instance),
-- ARGV[2] the state as JSON, ARGV[3] '1' when the instance ended,
-- ARGV[4] the ids of the latest applied events (JSON list)
--
-- Returns {1} when saved (the version is now ARGV[1] + 1), {0} when
-- someone saved the instance in between.
local current = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if current ~= tonumber(ARGV[1]) then
  return {0}
end
redis.call('HSET', KEYS[1], 'version', current + 1, 'state', ARGV[2], 'ended', ARGV[3],
  'applied', ARGV[4])
return {1}
