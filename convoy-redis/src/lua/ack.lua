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
-- KEYS[6r+1 .. 6r+6] for request r (from 0): lease, stream, unit state
-- hash, the category's set of registered groups, the group's acknowledged
-- count (for lag: read only summed over the category's shards, so the
-- caller names one shard's counter for every request of a category, and
-- the call runs one INCRBY per counter named), the owner's liveness key in
-- the unit's shard (on a cluster every request of a call is in one shard;
-- on one server a call may span shards)
-- ARGV[1] group, ARGV[2] now (ms), then per request: fence token, the
-- owner's incarnation, flags ('h': the head had failures, clear them; 'a':
-- record the unit's last activity; 't': trim what every group consumed;
-- '-' alone: none), number of ids, the entry ids
--
-- A trim never removes an entry that is still pending for any consumer of
-- any group: after a read whose reply was lost, this consumer may have
-- entries pending below the ones it acknowledges, and they must survive
-- until it has re-read and handled them.
--
-- Returns {1, per request: a refusal (see fence.lua) when fenced out, else
-- the number of entries acknowledged}.
local group = ARGV[1]
local now = ARGV[2]
-- How many groups a category's set has, read once per call.
local group_counts = {}
local function groups_of(key)
  local n = group_counts[key]
  if n == nil then
    n = redis.call('SCARD', key)
    group_counts[key] = n
  end
  return n
end

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


-- Removes what every registered group has consumed.
local function trim(stream, groups_key, last)
  if groups_of(groups_key) <= 1 then
    -- The only group reading this stream: everything up to the last id
    -- acknowledged is done, except what is still pending (entries of a
    -- read whose reply never arrived, not handled yet).
    local min = after(last)
    local oldest = redis.call('XPENDING', stream, group, '-', '+', 1)[1]
    if oldest and less(oldest[1], min) then
      min = oldest[1]
    end
    redis.call('XTRIM', stream, 'MINID', min)
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

-- Every request's lease and liveness key, read in one MGET: lease of
-- request r at 2r+1, its owner's liveness at 2r+2.
local fences = {}
for r = 0, #KEYS / 6 - 1 do
  fences[2 * r + 1] = KEYS[6 * r + 1]
  fences[2 * r + 2] = KEYS[6 * r + 6]
end
local held = redis.call('MGET', unpack(fences))

local out = {1}
local counts = {}
local a = 3
local r = 0
while a <= #ARGV do
  local token = ARGV[a]
  local inc = ARGV[a + 1]
  local flags = ARGV[a + 2]
  local n = tonumber(ARGV[a + 3])
  -- The ids are ARGV[first .. last] (unpacked from ARGV, no table).
  local first, last = a + 4, a + 3 + n
  a = a + 4 + n
  local stream, unit, groups_key, acked =
    KEYS[6 * r + 2], KEYS[6 * r + 3], KEYS[6 * r + 4], KEYS[6 * r + 5]
  local no = refusal_held(held[2 * r + 2], held[2 * r + 1], token, inc)
  r = r + 1
  if no then
    out[#out + 1] = no
  else
    local done = redis.call('XACK', stream, group, unpack(ARGV, first, last))
    counts[acked] = (counts[acked] or 0) + done
    -- Most acknowledgements carry no flag ('-').
    if flags ~= '-' then
      if string.find(flags, 'h', 1, true) then
        redis.call('HDEL', unit, 'head', 'attempts')
      end
      if string.find(flags, 'a', 1, true) then
        redis.call('HSET', unit, 'active', now)
      end
      if string.find(flags, 't', 1, true) then
        trim(stream, groups_key, ARGV[last])
      end
    end
    out[#out + 1] = done
  end
end
for k, c in pairs(counts) do
  redis.call('INCRBY', k, c)
end
return out
