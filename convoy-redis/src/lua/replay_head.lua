-- Operator replay of a dead letter at the HEAD of its partition, for one
-- consumer group: the dead letter goes back before every event that group
-- has not finished (its pending head, when it is halted there, and every
-- entry after it), so the key's order is restored after a mistaken
-- dead-letter. A stream is append-only: the dead letter and then copies of
-- those entries are appended, the originals deleted (the group's pending
-- head acknowledged without counting it as handled). All in one script.
--
-- KEYS[1] the key's dead letter stream, KEYS[2] the partition stream,
-- KEYS[3] the category's partition index in the shard, KEYS[4] the shard's
-- audit stream, KEYS[5] the category's published count in the shard,
-- KEYS[6] the category's set of registered groups in the shard, KEYS[7] the
-- group's unit state hash, KEYS[8] the group's lease; all in the key's shard
-- ARGV[1] dead letter id, ARGV[2] partition key, ARGV[3] operator,
-- ARGV[4] now (ms), ARGV[5] category, ARGV[6] group, ARGV[7] force ('1'),
-- ARGV[8] the first unfinished entry the operator confirmed ('' for
-- whatever it is, 'none' for none), ARGV[9] the unit's durable generation
-- the operator confirmed ('' for whatever it is)
--
-- Refused (nothing changed) when another group has already read an entry
-- that would move (it would get it again), or when the group has events in
-- flight and is not halted on its head (without force; with force the
-- owner is fenced out first, as for skip). The copy keeps the event's
-- identity and carries a `replay` field for this group alone, as a replay
-- at the tail does (the other groups, which have not read this far, get
-- the original and acknowledge the copy unread); a gap recorded for this
-- dead letter is cleared.
--
-- Returns {'missing'}, {'empty'}, {'wrong_key', key}, {'wrong_group',
-- group}, {'other_lane', stream}, {'read_elsewhere', group},
-- {'running', head}, {'generation_moved', generation}, {'changed', first
-- unfinished entry or ''}, or {'ok', new entry id, audit id, moved count}.
local stream = KEYS[2]
local group = ARGV[6]
local r = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #r == 0 then
  return {'missing'}
end
local flat = r[1][2]
local copy = {}
local letter_group, source = '', ''
for j = 1, #flat, 2 do
  local name, value = flat[j], flat[j + 1]
  if name == 'dlq_group' then
    letter_group = value
  elseif name == 'dlq_source' then
    source = value
  elseif string.sub(name, 1, 4) ~= 'dlq_' and name ~= 'replay' then
    if name == 'key' and value ~= ARGV[2] then
      return {'wrong_key', value}
    end
    copy[#copy + 1] = name
    copy[#copy + 1] = value
  end
end
if #copy == 0 then
  return {'empty'}
end
if letter_group ~= '' and letter_group ~= group then
  return {'wrong_group', letter_group}
end
if source ~= '' and source ~= stream then
  return {'other_lane', source}
end
copy[#copy + 1] = 'replay'
copy[#copy + 1] = cjson.encode({by = group, to = {group}})

local function id_parts(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function before(a, b)
  local am, as = id_parts(a)
  local bm, bs = id_parts(b)
  return am < bm or (am == bm and as < bs)
end
local function last_delivered(g)
  local groups = redis.pcall('XINFO', 'GROUPS', stream)
  if type(groups) ~= 'table' or groups.err then
    return nil
  end
  for _, info in ipairs(groups) do
    local f = {}
    for j = 1, #info, 2 do
      f[info[j]] = info[j + 1]
    end
    if f['name'] == g then
      return f['last-delivered-id']
    end
  end
  return nil
end

-- The first entry the group has not finished: its first pending one, else
-- the first after its last-delivered id.
local first, pending = nil, false
if redis.call('EXISTS', stream) == 1 then
  local p = redis.pcall('XPENDING', stream, group, '-', '+', 1)
  if type(p) == 'table' and not p.err and #p > 0 then
    first, pending = p[1][1], true
  else
    local last = last_delivered(group)
    local after = redis.call('XRANGE', stream, last and ('(' .. last) or '-', '+', 'COUNT', 1)
    if #after > 0 then
      first = after[1][1]
    end
  end
end

-- What the operator confirmed: the unit at this generation, this entry
-- first unfinished (a new owner, another operator's action or events
-- handled since make the confirmation stale).
if ARGV[9] ~= '' then
  local gen = redis.call('HGET', KEYS[7], 'gen') or '0'
  if gen ~= ARGV[9] then
    return {'generation_moved', gen}
  end
end
if ARGV[8] ~= '' and ARGV[8] ~= (first or 'none') then
  return {'changed', first or ''}
end

local forced, fenced = '0', ''
if first then
  if pending then
    local state = redis.call('HMGET', KEYS[7], 'halted', 'halt_entry')
    local on_halt = state[1] == '1' and state[2] == first
    if not on_halt then
      if ARGV[7] ~= '1' then
        return {'running', first}
      end
      forced = '1'
      local token = redis.call('GET', KEYS[8])
      if token then
        fenced = token
        redis.call('HINCRBY', KEYS[7], 'gen', 1)
        redis.call('DEL', KEYS[8])
      end
    end
  end
  for _, g in ipairs(redis.call('SMEMBERS', KEYS[6])) do
    if g ~= group then
      local last = last_delivered(g)
      if last and not before(last, first) then
        return {'read_elsewhere', g}
      end
    end
  end
end

local id = redis.call('XADD', stream, '*', unpack(copy))
local moved = 0
if first then
  for _, e in ipairs(redis.call('XRANGE', stream, first, '(' .. id)) do
    redis.call('XADD', stream, '*', unpack(e[2]))
    redis.call('XDEL', stream, e[1])
    moved = moved + 1
  end
  if pending then
    redis.call('XACK', stream, group, first)
  end
end
redis.call('INCRBY', KEYS[5], 1)
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[7], 'halted', 'halt_reason', 'halt_error', 'halt_since',
  'halt_entry', 'head', 'attempts')
if redis.call('HGET', KEYS[7], 'gap_dlq') == ARGV[1] then
  redis.call('HDEL', KEYS[7], 'gap_entry', 'gap_message', 'gap_reason', 'gap_time', 'gap_dlq')
end
redis.call('HSET', KEYS[7], 'active', ARGV[4])
local audit = redis.call('XADD', KEYS[4], '*', 'op', 'replay', 'at', 'head',
  'category', ARGV[5], 'key', ARGV[2], 'group', group, 'to', group, 'entry', id,
  'operator', ARGV[3], 'time', ARGV[4], 'forced', forced, 'stream', stream,
  'dlq_entry', ARGV[1], 'moved', moved, 'fenced', fenced)
return {'ok', id, audit, moved}
