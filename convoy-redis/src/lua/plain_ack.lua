-- Acknowledges entries of an ordinary (unpartitioned) stream and removes
-- the ones every registered group has consumed.
--
-- KEYS[1] stream, KEYS[2] the category's set of registered groups
-- ARGV[1] group, ARGV[2..] entry ids
-- Returns {1, the number acknowledged}.
local ids = {}
for i = 2, #ARGV do
  ids[#ids + 1] = ARGV[i]
end
local n = redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
if redis.call('SCARD', KEYS[2]) <= 1 then
  redis.call('XDEL', KEYS[1], unpack(ids))
end
return {1, n}
