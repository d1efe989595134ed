-- Releases a lease if it is still held with this fence token, and wakes
-- the other instances so one with room takes the unit at once (rather than
-- finding it free at its next heartbeat).
--
-- KEYS[1] lease, KEYS[2] a wake stream of the unit's category
-- ARGV[1] token, or with ARGV[4] = 'prefix' the owner's prefix `{owner}:`
-- (releases this owner's lease whatever its generation: for a lease the
-- instance may hold without a worker, after a lost reply),
-- ARGV[2] the unit's key, ARGV[3] wake stream approximate max length
-- Returns 1 when released, 0 otherwise.
local cur = redis.call('GET', KEYS[1])
local mine = cur == ARGV[1]
if cur and ARGV[4] == 'prefix' then
  mine = string.sub(cur, 1, #ARGV[1]) == ARGV[1]
end
if mine then
  redis.call('DEL', KEYS[1])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'k', ARGV[2], 'r', '1')
  return 1
end
return 0
