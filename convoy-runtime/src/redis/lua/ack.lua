-- Fenced acknowledgement: the lease is checked first, then the entries are
-- acknowledged, the head's failure count is cleared, the unit's last
-- activity is recorded, and entries every registered group has consumed are
-- removed from the stream (so a drained partition is empty and can be
-- reaped).
--
-- KEYS[1] lease, KEYS[2] stream, KEYS[3] unit state hash, KEYS[4] the
-- category's set of registered groups, KEYS[5] the group's acknowledged
-- count (for lag), KEYS[6] the owner's liveness key
-- ARGV[1] fence token, ARGV[2] group, ARGV[3] now (ms), ARGV[4..] entry ids
--
-- Returns -1 when the lease is not held with this token, else the number
-- of entries acknowledged.
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('EXISTS', KEYS[#KEYS]) == 0 then
  return -1
end
local ids = {}
for i = 4, #ARGV do
  ids[#ids + 1] = ARGV[i]
end
local n = redis.call('XACK', KEYS[2], ARGV[2], unpack(ids))
redis.call('HDEL', KEYS[3], 'head', 'attempts')
redis.call('HSET', KEYS[3], 'active', ARGV[3])
redis.call('INCRBY', KEYS[5], n)

if redis.call('SCARD', KEYS[4]) <= 1 then
  -- The only group reading this stream: this consumer handles and
  -- acknowledges entries in id order, so everything up to the last id is
  -- done. One trim removes them all (cheaper than deleting id by id).
  local ms, seq = string.match(ids[#ids], '(%d+)-(%d+)')
  redis.call('XTRIM', KEYS[2], 'MINID', ms .. '-' .. (tonumber(seq) + 1))
  return n
end

local groups = redis.call('SMEMBERS', KEYS[4])

-- Several groups read this stream: keep every entry some group still needs.
local known = {}
local info = redis.call('XINFO', 'GROUPS', KEYS[2])
local min = nil
local function less(a, b)
  local am, as = string.match(a, '(%d+)-(%d+)')
  local bm, bs = string.match(b, '(%d+)-(%d+)')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as < bs)
end
for _, g in ipairs(info) do
  local f = {}
  for j = 1, #g, 2 do
    f[g[j]] = g[j + 1]
  end
  known[f['name']] = true
  local keep
  if tonumber(f['pending']) > 0 then
    local p = redis.call('XPENDING', KEYS[2], f['name'], '-', '+', 1)
    keep = p[1][1]
  else
    local ms, seq = string.match(f['last-delivered-id'], '(%d+)-(%d+)')
    keep = ms .. '-' .. (tonumber(seq) + 1)
  end
  if min == nil or less(keep, min) then
    min = keep
  end
end
for _, g in ipairs(groups) do
  if not known[g] then
    return n
  end
end
if min then
  redis.call('XTRIM', KEYS[2], 'MINID', min)
end
return n
