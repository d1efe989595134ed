-- Fenced read of a unit: the fence is checked first, then the unit's
-- primary lanes are read (one stream per category the unit spans: one for
-- a handler's partition, several for a process manager's correlation
-- value), and the backfill lanes only when every primary lane is empty.
--
-- KEYS[1]                 lease
-- KEYS[2 .. n+1]          primary streams
-- KEYS[n+2 .. 2n+1]       backfill streams (only when lanes are on)
-- KEYS[#KEYS]             the owner's liveness key
-- ARGV[1] fence token (also the consumer name), ARGV[2] group,
-- ARGV[3] primary count, ARGV[4] backfill count,
-- ARGV[5] '0' to re-read this consumer's pending entries, '>' for new ones,
-- ARGV[6] n, ARGV[7] the lane to look at first (rotates for fairness
-- between the categories of one unit), ARGV[8] the owner's incarnation,
-- ARGV[9] '1' when priority lanes are on (the backfill streams are in KEYS)
-- ARGV[10] for a read of new entries: '' (no check), or how many entries
-- the caller holds pending (handled, not yet acknowledged) in the stream
-- KEYS[ARGV[11]] (none in the others). This consumer holding more pending
-- than that means an earlier read ran without the caller seeing its reply
-- (the client sent it again after a dropped connection, as the Redis
-- Cluster client does): its entries would be passed over, so nothing new
-- is read and {0} is returned; the caller reads its pending entries first.
-- ARGV[12] for a read of new entries: the most entries returned whole; a
-- longer batch comes back as its ids only (every entry passed back
-- through Lua costs Redis about as much again as the read itself), and the
-- caller reads their fields with one XRANGE over the ids' range: a read of
-- new entries delivers consecutive entries of the stream, and one deleted
-- meanwhile is missing from the XRANGE as it would be field-less here.
--
-- Every key is passed by name, never as '': a Redis ACL user limited to
-- convoy's key patterns is refused any key outside them, even an empty one.
--
-- A stream without the group (new, or re-created by a publish after a
-- reap) gets the group at id 0, so nothing published is skipped.
-- Returns {refusal} (see fence.lua) when fenced out; {2, ...} (see
-- moved_back in fence.lua) when another consumer held entries pending;
-- {0} (see ARGV[10]);
-- {-4, stream, type}
-- when a lane's key holds something other than a stream; else
-- {1, lane, entries}: lane i in 1..n is primary stream i, n+i its
-- backfill lane, 0 none; entries as XREADGROUP returns them for one stream
-- (an entry deleted while pending comes back with no fields); or
-- {1, lane, ids, 1} for a longer batch of new entries (see ARGV[12]).
local no = refusal(KEYS[1], ARGV[1], KEYS[#KEYS], ARGV[8])
if no then
  return {no}
end

-- Entries another consumer of the group holds pending in one of the
-- unit's streams: what a replaced owner read natively after it lost the
-- lease (see verify.lua), whose check may not have run on the owner's
-- side (its reply lost with the read's, or a redirection on a cluster).
-- Moved to this consumer before anything is read, one stream per call.
for i = 2, #KEYS - 1 do
  local own, others = pending_of(KEYS[i], ARGV[2], ARGV[1])
  if others then
    return moved_back(KEYS[i], ARGV[2], ARGV[1], own)
  end
end

local function unseen(stream, at)
  if ARGV[5] ~= '>' or ARGV[10] == nil or ARGV[10] == '' then
    return false
  end
  local held = 0
  if tostring(at) == ARGV[11] then
    held = tonumber(ARGV[10])
  end
  local p = redis.pcall('XPENDING', stream, ARGV[2], '-', '+', held + 1, ARGV[1])
  return type(p) == 'table' and not p.err and #p > held
end

local function read(stream, count, at)
  if redis.call('EXISTS', stream) == 0 then
    return false
  end
  if unseen(stream, at) then
    return {unseen = true}
  end
  local r = redis.pcall('XREADGROUP', 'GROUP', ARGV[2], ARGV[1], 'COUNT', count,
    'STREAMS', stream, ARGV[5])
  if type(r) == 'table' and r.err then
    local wrong = not_a_stream(stream)
    if wrong then
      return {wrong = wrong}
    end
    redis.call('XGROUP', 'CREATE', stream, ARGV[2], '0')
    r = redis.call('XREADGROUP', 'GROUP', ARGV[2], ARGV[1], 'COUNT', count,
      'STREAMS', stream, ARGV[5])
  end
  if not r then
    return false
  end
  local entries = r[1][2]
  if #entries == 0 then
    return false
  end
  return entries
end

local n = tonumber(ARGV[6])
local first = tonumber(ARGV[7])
local passes = 0
if ARGV[9] == '1' then
  passes = 1
end
for pass = 0, passes do
  for j = 0, n - 1 do
    local i = (first + j) % n
    local at = 2 + pass * n + i
    local stream = KEYS[at]
    local e = read(stream, ARGV[3 + pass], at)
    if e and e.wrong then
      return {-4, stream, e.wrong}
    end
    if e and e.unseen then
      return {0}
    end
    if e then
      local whole = tonumber(ARGV[12])
      if ARGV[5] == '>' and whole and #e > whole then
        local ids = {}
        for k = 1, #e do
          ids[k] = e[k][1]
        end
        return {1, pass * n + i + 1, ids, 1}
      end
      return {1, pass * n + i + 1, e}
    end
  end
end
return {1, 0, false}
