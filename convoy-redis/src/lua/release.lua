-- Releases a lease if it is still held with this fence token. The caller
-- then wakes the other instances (a wake-up written on its own, outside the
-- unit's shard), so one with room takes the unit at once rather than
-- finding it free at its next heartbeat.
--
-- KEYS[1] lease
-- ARGV[1] token, or with ARGV[2] = 'prefix' the owner's prefix `{owner}:`
-- (releases this owner's lease whatever its generation: for a lease the
-- instance may hold without a worker, after a lost reply)
-- Returns {1} when released, {0} otherwise.
local cur = redis.call('GET', KEYS[1])
local mine = cur == ARGV[1]
if cur and ARGV[2] == 'prefix' then
  mine = string.sub(cur, 1, #ARGV[1]) == ARGV[1]
end
if mine then
  redis.call('DEL', KEYS[1])
  return {1}
end
return {0}
