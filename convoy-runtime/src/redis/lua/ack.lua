-- Fenced acknowledgements of one or more units, in one call (the workers of
-- an instance that finish events at the same time share a round trip; each
-- still waits for its own acknowledgement before starting its next event).
--
-- For each unit the lease is checked first, then its entries are
-- acknowledged, the head's failure count is cleared, the unit's last
-- activity is recorded, and entries every registered group has consumed are
-- removed from the stream (so a drained partition is empty and can be
-- reaped).
--
-- KEYS[5r+1 .. 5r+5] for request r (from 0): lease, stream, unit state
-- hash, the category's set of registered groups, the group's acknowledged
-- count (for lag); the last KEY is the owner's liveness key
-- ARGV[1] group, ARGV[2] now (ms), then per request: fence token, flags
-- ('h': the head had failures, clear them; 'a': record the unit's last
-- activity; 't': trim what every group consumed; '-' alone: none), number
-- of ids, the entry ids
--
-- Returns per request: -1 when the lease is not held with this token by a
-- live owner, else the number of entries acknowledged.
local alive = redis.call('EXISTS', KEYS[#KEYS]) == 1
local group = ARGV[1]
local now = ARGV[2]

local function less(a, b)
  local am, as = string.match(a, '(%d+)-(%d+)')
  local bm, bs = string.match(b, '(%d+)-(%d+)')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as < bs)
end

local function after(id)
  local ms, seq = string.match(id, '(%d+)-(%d+)')
  return ms .. '-' .. (tonumber(seq) + 1)
end

local group_counts = {}
local function groups_of(groups_key)
  local n = group_counts[groups_key]
  if n == nil then
    n = redis.call('SCARD', groups_key)
    group_counts[groups_key] = n
  end
  return n
end

-- Removes what every registered group has consumed.
local function trim(stream, groups_key, last)
  if groups_of(groups_key) <= 1 then
    -- The only group reading this stream: this consumer handles and
    -- acknowledges entries in id order, so everything up to the last id is
    -- done. One trim removes them all.
    redis.call('XTRIM', stream, 'MINID', after(last))
    return
  end
  local known = {}
  local min = nil
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local f = {}
    for j = 1, #g, 2 do
      f[g[j]] = g[j + 1]
    end
    known[f['name']] = true
    local keep
    if tonumber(f['pending']) > 0 then
      keep = redis.call('XPENDING', stream, f['name'], '-', '+', 1)[1][1]
    else
      keep = after(f['last-delivered-id'])
    end
    if min == nil or less(keep, min) then
      min = keep
    end
  end
  for _, g in ipairs(redis.call('SMEMBERS', groups_key)) do
    if not known[g] then
      return
    end
  end
  if min then
    redis.call('XTRIM', stream, 'MINID', min)
  end
end

local out = {}
local counts = {}
local a = 3
local r = 0
while a <= #ARGV do
  local token = ARGV[a]
  local flags = ARGV[a + 1]
  local n = tonumber(ARGV[a + 2])
  local ids = {}
  for j = 1, n do
    ids[j] = ARGV[a + 2 + j]
  end
  a = a + 3 + n
  local lease, stream, unit, groups_key, acked =
    KEYS[5 * r + 1], KEYS[5 * r + 2], KEYS[5 * r + 3], KEYS[5 * r + 4], KEYS[5 * r + 5]
  r = r + 1
  if not alive or redis.call('GET', lease) ~= token then
    out[#out + 1] = -1
  else
    local done = redis.call('XACK', stream, group, unpack(ids))
    if string.find(flags, 'h', 1, true) then
      redis.call('HDEL', unit, 'head', 'attempts')
    end
    if string.find(flags, 'a', 1, true) then
      redis.call('HSET', unit, 'active', now)
    end
    counts[acked] = (counts[acked] or 0) + done
    if string.find(flags, 't', 1, true) then
      trim(stream, groups_key, ids[#ids])
    end
    out[#out + 1] = done
  end
end
for k, c in pairs(counts) do
  redis.call('INCRBY', k, c)
end
return out
