-- Operator action on a partition's head for one consumer group, atomic
-- against the owner (every owner operation is a script too): skip it, move
-- it to the key's dead letter stream, or retry it in place (ARGV[8] =
-- 'skip', 'dead_letter' or 'retry'). A retry acknowledges nothing: it
-- clears the halt and the head's failure count, so the owner runs the same
-- head again (attempt 1) and the key's order is kept. A dead letter carries the head's fields plus `dlq_group`,
-- `dlq_source`, `dlq_entry`, `dlq_error`, `dlq_time` and `dlq_operator`.
--
-- KEYS[1] unit state hash, KEYS[2] lease, KEYS[3] primary stream,
-- KEYS[4] backfill stream, KEYS[5] the category's set of registered groups,
-- KEYS[6] the shard's audit stream, KEYS[7] the key's dead letter stream,
-- KEYS[8] the group's acknowledged count for the category in the shard
-- (`convoy_lag` is published - acknowledged); all in the key's shard
-- ARGV[1] group, ARGV[2] force ('1' or '0'), ARGV[3] operator,
-- ARGV[4] now (ms), ARGV[5] category, ARGV[6] partition key,
-- ARGV[7] the head the operator confirmed ('' for whatever it is),
-- ARGV[8] the action, ARGV[9] the unit's durable generation the operator
-- confirmed ('' for whatever it is)
--
-- The head is the group's first pending entry (primary lane, then
-- backfill), or, when nothing is pending, the first entry after the group's
-- last-delivered id (primary, then backfill).
--
-- Without force it refuses unless the unit is halted on exactly that head.
-- With force (needed for a running partition), a live lease is fenced out
-- first: the durable generation is bumped and the lease deleted, so the old
-- owner's next fenced read or ack is refused; the event it has in flight may
-- still complete its side effects. The next owner takes the unit at a newer
-- generation and reclaims what is pending.
--
-- Both acknowledge a pending head (or moves the group past an
-- undelivered one) and count it as acknowledged, so `convoy_lag` drops
-- with the partition's lag, deletes it when this is the category's only group,
-- clears the halt and the head's failure count and appends an audit record;
-- the caller then writes a wake-up for the key: a halted owner waits for
-- one (or its next poll), then sees the halt cleared and resumes with the
-- next event.
--
-- Returns {status, ...}:
--   {'empty'}                          nothing to act on
--   {'not_a_stream', key, type}        a lane's key holds another type
--   {'unhalted', audit id}             the unit was halted because its key
--                                      was not a stream (fixed since): the
--                                      halt is cleared, nothing skipped
--   {'generation_moved', generation}  the unit's durable generation is
--                                      not ARGV[9] (checked first)
--   {'changed', head}                  the head is not ARGV[7]
--   {'not_halted', head}               running partition, no force
--   {'head_moved', head, halt_entry}   halted on another entry, no force
--   {'deleted', head}                  dead_letter only: the head's entry
--                                      no longer exists (skip it instead)
--   {'ok', head, lane, forced, fenced token or '', deleted, audit id,
--    was pending[, dead letter id]}

local unit, lease = KEYS[1], KEYS[2]
local streams = {KEYS[3], KEYS[4]}
local group = ARGV[1]
local op = ARGV[8]

local function fields(flat)
  local f = {}
  for j = 1, #flat, 2 do
    f[flat[j]] = flat[j + 1]
  end
  return f
end

local function first_pending(stream)
  if redis.call('EXISTS', stream) == 0 then
    return nil
  end
  local r = redis.pcall('XPENDING', stream, group, '-', '+', 1)
  if type(r) ~= 'table' or r.err or #r == 0 then
    return nil
  end
  return r[1][1]
end

local function first_new(stream)
  if redis.call('EXISTS', stream) == 0 then
    return nil, false
  end
  local last = nil
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local f = fields(g)
    if f['name'] == group then
      last = f['last-delivered-id']
    end
  end
  local r
  if last then
    r = redis.call('XRANGE', stream, '(' .. last, '+', 'COUNT', 1)
  else
    r = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)
  end
  if #r == 0 then
    return nil, last ~= nil
  end
  return r[1][1], last ~= nil
end

-- The operator confirmed what they saw at this generation: a new owner
-- or another operator's action since makes the confirmation stale.
if ARGV[9] ~= '' then
  local gen = redis.call('HGET', unit, 'gen') or '0'
  if gen ~= ARGV[9] then
    return {'generation_moved', gen}
  end
end

for i = 1, 2 do
  local wrong = not_a_stream(streams[i])
  if wrong then
    return {'not_a_stream', streams[i], wrong}
  end
end

-- Halted because a lane's key was not a stream, and fixed since: clear the
-- halt and let the owner resume; no event is skipped.
if redis.call('HGET', unit, 'halt_reason') == 'not a stream' then
  redis.call('HDEL', unit, 'halted', 'halt_reason', 'halt_error', 'halt_since',
    'halt_entry', 'head', 'attempts')
  local audit = redis.call('XADD', KEYS[6], '*', 'op', op, 'category', ARGV[5],
    'key', ARGV[6], 'group', group, 'entry', '', 'operator', ARGV[3],
    'time', ARGV[4], 'forced', ARGV[2], 'stream', streams[1], 'fenced', '')
  return {'unhalted', audit}
end

local head, lane, pending, has_group = nil, 0, false, true
for i = 1, 2 do
  head = first_pending(streams[i])
  if head then
    lane, pending = i, true
    break
  end
end
if not head then
  for i = 1, 2 do
    head, has_group = first_new(streams[i])
    if head then
      lane = i
      break
    end
  end
end
if not head then
  return {'empty'}
end
if ARGV[7] ~= '' and ARGV[7] ~= head then
  return {'changed', head}
end

local state = redis.call('HMGET', unit, 'halted', 'halt_entry', 'halt_error',
  'last_error')
local halted = state[1] == '1'
local on_halt = halted and pending and state[2] == head
if not on_halt and ARGV[2] ~= '1' then
  if not halted then
    return {'not_halted', head}
  end
  return {'head_moved', head, state[2] or ''}
end

local stream = streams[lane]
local entry = redis.call('XRANGE', stream, head, head)
if (op == 'dead_letter' or op == 'retry') and #entry == 0 then
  return {'deleted', head}
end

local forced = '0'
local fenced = ''
if not on_halt then
  forced = '1'
  local token = redis.call('GET', lease)
  if token then
    fenced = token
    redis.call('HINCRBY', unit, 'gen', 1)
    redis.call('DEL', lease)
  end
end

local dlq = nil
if op == 'dead_letter' then
  local err = ''
  if on_halt then
    err = state[3] or ''
  end
  if err == '' then
    err = state[4] or ''
  end
  local copy = entry[1][2]
  copy[#copy + 1] = 'dlq_group'
  copy[#copy + 1] = group
  copy[#copy + 1] = 'dlq_source'
  copy[#copy + 1] = stream
  copy[#copy + 1] = 'dlq_entry'
  copy[#copy + 1] = head
  copy[#copy + 1] = 'dlq_error'
  copy[#copy + 1] = err
  copy[#copy + 1] = 'dlq_time'
  copy[#copy + 1] = ARGV[4]
  copy[#copy + 1] = 'dlq_operator'
  copy[#copy + 1] = ARGV[3]
  dlq = redis.call('XADD', KEYS[7], '*', unpack(copy))
end

if op == 'retry' then
  -- Nothing acknowledged or moved: the head stays where it is, pending
  -- (or next to deliver), and its owner (or, when forced, the next owner
  -- after the reclaim) runs it again.
  redis.call('HDEL', unit, 'halted', 'halt_reason', 'halt_error', 'halt_since',
    'halt_entry', 'head', 'attempts')
  redis.call('HSET', unit, 'active', ARGV[4])
  local audit = redis.call('XADD', KEYS[6], '*', 'op', op, 'category', ARGV[5],
    'key', ARGV[6], 'group', group, 'entry', head, 'operator', ARGV[3],
    'time', ARGV[4], 'forced', forced, 'stream', stream, 'fenced', fenced)
  return {'ok', head, lane, forced, fenced, 0, audit, pending and 1 or 0}
end

local done = 1
if pending then
  done = redis.call('XACK', stream, group, head)
elseif has_group then
  redis.call('XGROUP', 'SETID', stream, group, head)
else
  redis.call('XGROUP', 'CREATE', stream, group, head)
end
redis.call('INCRBY', KEYS[8], done)
local deleted = 0
if redis.call('SCARD', KEYS[5]) <= 1 then
  deleted = redis.call('XDEL', stream, head)
end
redis.call('HDEL', unit, 'halted', 'halt_reason', 'halt_error', 'halt_since',
  'halt_entry', 'head', 'attempts')
redis.call('HSET', unit, 'active', ARGV[4])

local record = {'op', op, 'category', ARGV[5], 'key', ARGV[6], 'group', group,
  'entry', head, 'operator', ARGV[3], 'time', ARGV[4], 'forced', forced,
  'stream', stream, 'fenced', fenced}
if dlq then
  record[#record + 1] = 'dlq_entry'
  record[#record + 1] = dlq
end
local audit = redis.call('XADD', KEYS[6], '*', unpack(record))
if dlq then
  return {'ok', head, lane, forced, fenced, deleted, audit, pending and 1 or 0, dlq}
end
return {'ok', head, lane, forced, fenced, deleted, audit, pending and 1 or 0}
