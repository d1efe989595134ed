-- Prepended to the fenced scripts that read or move a unit's entries
-- (every one but ack.lua; see scripts/mod.rs), after fence.lua.
--
-- Whether a key holds something other than a stream (an operator's or a
-- foreign program's key where a partition stream belongs). Returns its type
-- then, else nil.
local function not_a_stream(key)
  if key == '' then
    return nil
  end
  local t = redis.call('TYPE', key)
  t = t.ok or t
  if t == 'none' or t == 'stream' then
    return nil
  end
  return t
end

-- What the consumers of `group` hold pending in `stream` (XPENDING's
-- summary, a line per consumer that holds any): how many `consumer`
-- holds, whether any other consumer holds one, and the oldest pending id
-- of the group (`consumer`'s own oldest when no other consumer holds one;
-- false for none). A stream or group that does not exist (or a key of
-- another type) holds nothing.
local function pending_of(stream, group, consumer)
  local p = redis.pcall('XPENDING', stream, group)
  if type(p) ~= 'table' or p.err then
    return 0, false, false
  end
  local own, others = 0, false
  for _, c in ipairs(p[4] or {}) do
    if c[1] == consumer then
      own = tonumber(c[2])
    else
      others = true
    end
  end
  return own, others, p[2]
end

-- Moves every entry of `stream` pending in `group` to `consumer` (entries
-- of earlier generations, or of a replaced owner's unfenced read), then
-- deletes the group's other consumers, which have nothing pending left.
-- Returns how many entries were moved, and the ids that were pending but
-- whose entries no longer exist (XAUTOCLAIM drops them from the pending
-- list; the caller reports them, it never skips them silently).
local function claim_all(stream, group, consumer)
  local cursor = '0-0'
  local n = 0
  local deleted = {}
  repeat
    local r = redis.call('XAUTOCLAIM', stream, group, consumer, 0, cursor,
      'COUNT', 1000, 'JUSTID')
    cursor = r[1]
    n = n + #r[2]
    for _, id in ipairs(r[3] or {}) do
      deleted[#deleted + 1] = id
    end
  until cursor == '0-0'
  local consumers = redis.call('XINFO', 'CONSUMERS', stream, group)
  for _, c in ipairs(consumers) do
    local f = {}
    for j = 1, #c, 2 do
      f[c[j]] = c[j + 1]
    end
    if f['name'] ~= consumer and tonumber(f['pending']) == 0 then
      redis.call('XGROUP', 'DELCONSUMER', stream, group, f['name'])
    end
  end
  return n, deleted
end

-- The reply of a read whose check found entries another consumer of the
-- group held pending in `stream` (a replaced owner's unfenced read; the
-- reclaim at takeover leaves none): they are moved to `consumer`, which
-- held `own` there, and the caller reads its pending entries before
-- anything new. {2, stream, entries moved, ids whose entries are gone...}.
local function moved_back(stream, group, consumer, own)
  local n, deleted = claim_all(stream, group, consumer)
  local out = {2, stream, math.max(n - own, 0)}
  for _, id in ipairs(deleted) do
    out[#out + 1] = id
  end
  return out
end
