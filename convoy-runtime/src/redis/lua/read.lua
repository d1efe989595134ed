-- Fenced read of a unit: the lease is checked first, then the primary lane
-- is read, and the backfill lane only when the primary lane has nothing.
--
-- KEYS[1] lease, KEYS[2] primary stream, KEYS[3] backfill stream ('' when
-- lanes are off), KEYS[4] the owner's liveness key
-- ARGV[1] fence token (also the consumer name), ARGV[2] group,
-- ARGV[3] primary count, ARGV[4] backfill count,
-- ARGV[5] '0' to re-read this consumer's pending entries, '>' for new ones
--
-- A stream without the group (new, or re-created by a publish after a
-- reap) gets the group at id 0, so nothing published is skipped.
-- Returns {-1} when the lease is not held with this token by a live owner,
-- else
-- {1, lane, entries} with lane 1 (primary) or 2 (backfill) and entries as
-- XREADGROUP returns them for one stream (or false when there are none).
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('EXISTS', KEYS[#KEYS]) == 0 then
  return {-1}
end

local function read(stream, count)
  if redis.call('EXISTS', stream) == 0 then
    return false
  end
  local r = redis.pcall('XREADGROUP', 'GROUP', ARGV[2], ARGV[1], 'COUNT', count,
    'STREAMS', stream, ARGV[5])
  if type(r) == 'table' and r.err then
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

local e = read(KEYS[2], ARGV[3])
if e then
  return {1, 1, e}
end
if KEYS[3] ~= '' then
  e = read(KEYS[3], ARGV[4])
  if e then
    return {1, 2, e}
  end
end
return {1, 0, false}
