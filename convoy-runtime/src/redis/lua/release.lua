-- Releases a lease if it is still held with this fence token.
-- KEYS[1] lease; ARGV[1] token. Returns 1 when released, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
