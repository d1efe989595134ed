-- Reclaim on takeover: moves every pending entry of the unit's stream, left
-- by earlier generations, to this generation's consumer, then deletes the
-- old consumers that have nothing pending.
--
-- KEYS[1] lease, KEYS[2] stream, KEYS[3] the owner's liveness key
-- ARGV[1] fence token (the consumer name), ARGV[2] group
--
-- Returns -1 when the lease is not held with this token, else the number of
-- entries claimed.
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('EXISTS', KEYS[#KEYS]) == 0 then
  return -1
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
local created = redis.pcall('XGROUP', 'CREATE', KEYS[2], ARGV[2], '0')
local cursor = '0-0'
local n = 0
repeat
  local r = redis.call('XAUTOCLAIM', KEYS[2], ARGV[2], ARGV[1], 0, cursor,
    'COUNT', 1000, 'JUSTID')
  cursor = r[1]
  n = n + #r[2]
until cursor == '0-0'
local consumers = redis.call('XINFO', 'CONSUMERS', KEYS[2], ARGV[2])
for _, c in ipairs(consumers) do
  local f = {}
  for j = 1, #c, 2 do
    f[c[j]] = c[j + 1]
  end
  if f['name'] ~= ARGV[1] and tonumber(f['pending']) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[2], ARGV[2], f['name'])
  end
end
return n
