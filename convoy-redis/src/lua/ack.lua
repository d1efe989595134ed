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
-- Each argument of a call costs Redis about a tenth of a microsecond (read,
-- then made a Lua string), more than an XACK of one id once a unit has ten,
-- so a unit costs two keys and two values besides its ids, and what units
-- share is named once per call:
--
-- KEYS[1 .. na]            liveness keys: the owner's liveness key in a
--                          unit's shard, one per (key, incarnation) pair the
--                          call's units name
-- KEYS[na+1 .. na+u]       the units' leases, unit r at na+r
-- KEYS[na+u+1 .. na+u+C]   the groups' acknowledged counts, one per category
--                          (for lag: read only summed over a category's
--                          shards, so a call adds every unit of a category to
--                          one counter, one INCRBY per counter)
-- KEYS[na+u+C+1 .. ns]     the categories' sets of registered groups (for
--                          trims)
-- KEYS[ns+1 ..]            per unit: its stream, then its state hash only
--                          when its flags name 'h' or 'a'
-- ARGV[1] group, ARGV[2] now (ms), ARGV[3] na, ARGV[4] u, ARGV[5] ns,
-- ARGV[6] C, ARGV[7] S (one more than the most ids a unit of the call
-- has), ARGV[8 .. 7+na] the incarnation of each liveness pair, then per
-- unit its fence token, its spec and its ids. The spec is a number when
-- the unit has no flags: ((pair - 1) * C + counter - 1) * S + n, for its
-- liveness pair (1 .. na), its counter (1 .. C) and its n ids; else
-- 'number:flags:groups' with flags of 'h' (the head had
-- failures, clear them), 'a' (record the unit's last activity), 't' (trim
-- what every group consumed), and groups the index into KEYS of the
-- category's groups set (0 without 't'). A number, not a string to match,
-- since most units have no flags and arithmetic costs Lua less.
--
-- A trim never removes an entry that is still pending for any consumer of
-- any group: after a read whose reply was lost, this consumer may have
-- entries pending below the ones it acknowledges, and they must survive
-- until it has re-read and handled them.
--
-- Returns {1, the answers}: per unit, in order, a refusal (see fence.lua)
-- when fenced out, else the number of entries acknowledged, joined by
-- commas in one string (the client parses one value per call rather than
-- one per unit: each value of a reply costs it far more than a number in
-- a string).
local group = ARGV[1]
local now = ARGV[2]
local na = tonumber(ARGV[3])
local units = tonumber(ARGV[4])
local ns = tonumber(ARGV[5])
local counters = tonumber(ARGV[6])
local span = tonumber(ARGV[7])

-- Removes from `stream` what every registered group has consumed. One
-- function (its helpers inside): a script's functions are made again at
-- every call, and most calls trim nothing.
local function trim(stream, groups_key, last)
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
  if redis.call('SCARD', groups_key) <= 1 then
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

-- Every liveness key and lease, in one MGET.
local held = redis.call('MGET', unpack(KEYS, 1, na + units))

local out = {}
local counts = {}
local a = 8 + na
local k = ns + 1
for r = 1, units do
  local token = ARGV[a]
  local spec = ARGV[a + 1]
  local code = tonumber(spec)
  local flags, groups_key = nil, nil
  if code == nil then
    local c, f, g = string.match(spec, '^(%d+):(%a*):(%d+)$')
    code, flags, groups_key = tonumber(c), f, KEYS[tonumber(g)]
  end
  local n = code % span
  code = (code - n) / span
  local counter = code % counters
  local pair = (code - counter) / counters + 1
  -- The ids are ARGV[first .. last] (unpacked from ARGV, no table).
  local first, last = a + 2, a + 1 + n
  a = last + 1
  local stream = KEYS[k]
  local unit = nil
  k = k + 1
  if flags and string.find(flags, '[ha]') then
    unit = KEYS[k]
    k = k + 1
  end
  local live, cur = held[pair], held[na + r]
  if live == ARGV[7 + pair] and cur == token then
    local done = redis.call('XACK', stream, group, unpack(ARGV, first, last))
    counts[counter] = (counts[counter] or 0) + done
    if flags then
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
  else
    out[#out + 1] = refusal_held(live, cur, token, ARGV[7 + pair])
  end
end
for c, n in pairs(counts) do
  if n > 0 then
    redis.call('INCRBY', KEYS[na + units + 1 + c], n)
  end
end
return {1, table.concat(out, ',')}
