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
-- KEYS[na+u+1 .. ns]       shared keys: the groups' acknowledged counts (for
--                          lag: read only summed over a category's shards,
--                          so a call adds every unit of a category to one
--                          counter, one INCRBY per counter named), then the
--                          categories' sets of registered groups (for trims)
-- KEYS[ns+1 ..]            per unit: its stream, then its state hash only
--                          when its flags name 'h' or 'a'
-- ARGV[1] group, ARGV[2] now (ms), ARGV[3] na, ARGV[4] u, ARGV[5] ns,
-- ARGV[6 .. 5+na] the incarnation of each liveness pair, then the units in
-- runs that share a liveness pair and a counter: per run its pair (1 ..
-- na), its counter (an index into KEYS) and how many units it has, then
-- per unit its fence token, its spec and its ids. The spec is the number
-- of ids alone when the unit has no flags, else 'n:flags:groups' with
-- flags of 'h' (the head had failures, clear them), 'a' (record the unit's
-- last activity), 't' (trim what every group consumed), and groups the
-- index into KEYS of the category's groups set (0 without 't').
--
-- A trim never removes an entry that is still pending for any consumer of
-- any group: after a read whose reply was lost, this consumer may have
-- entries pending below the ones it acknowledges, and they must survive
-- until it has re-read and handled them.
--
-- Returns {1, per unit: a refusal (see fence.lua) when fenced out, else
-- the number of entries acknowledged}.
local group = ARGV[1]
local now = ARGV[2]
local na = tonumber(ARGV[3])
local units = tonumber(ARGV[4])
local ns = tonumber(ARGV[5])
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

-- Every liveness key and lease, in one MGET.
local held = redis.call('MGET', unpack(KEYS, 1, na + units))

local out = {1}
local counts = {}
local a = 6 + na
local k = ns + 1
local r = 0
while r < units do
  -- A run of units that share a liveness pair and a counter.
  local pair, counter, m = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  local live, inc = held[pair], ARGV[5 + pair]
  local done_in_run = 0
  for _ = 1, m do
    r = r + 1
    local token = ARGV[a]
    local spec = ARGV[a + 1]
    local n = tonumber(spec)
    local groups_key, flags = nil, ''
    if n == nil then
      local g
      n, flags, g = string.match(spec, '^(%d+):(%a*):(%d+)$')
      n = tonumber(n)
      groups_key = KEYS[tonumber(g)]
    end
    -- The ids are ARGV[first .. last] (unpacked from ARGV, no table).
    local first, last = a + 2, a + 1 + n
    a = last + 1
    local stream = KEYS[k]
    local unit = nil
    k = k + 1
    if string.find(flags, '[ha]') then
      unit = KEYS[k]
      k = k + 1
    end
    local no = refusal_held(live, held[na + r], token, inc)
    if no then
      out[#out + 1] = no
    else
      local done = redis.call('XACK', stream, group, unpack(ARGV, first, last))
      done_in_run = done_in_run + done
      if flags ~= '' then
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
  counts[counter] = (counts[counter] or 0) + done_in_run
end
for c, n in pairs(counts) do
  if n > 0 then
    redis.call('INCRBY', KEYS[c], n)
  end
end
return out
