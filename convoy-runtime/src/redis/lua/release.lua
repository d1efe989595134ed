-- Releases a lease if it is still held with this fence token, and wakes
-- the other instances so one with room takes the unit at once (rather than
-- finding it free at its next heartbeat).
--
-- KEYS[1] lease, KEYS[2] a wake stream of the unit's category
-- ARGV[1] token, ARGV[2] the unit's key, ARGV[3] wake stream approximate
-- max length
-- Returns 1 when released, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'k', ARGV[2], 'r', '1')
  return 1
end
return 0
