-- Operator replay of a dead letter: its original envelope goes back to the
-- partition's tail, as a new entry after everything already there, for the
-- handlers named, and the dead letter is removed, together.
--
-- KEYS[1] the key's dead letter stream, KEYS[2] the partition stream,
-- KEYS[3] the category's partition index in the shard, KEYS[4] the shard's
-- audit stream, KEYS[5] the category's published count in the shard
-- (`convoy_lag` is published - acknowledged: the replayed entry is one
-- more to handle), KEYS[6] the category's set of registered groups in the
-- shard; all in the key's shard
-- ARGV[1] dead letter id, ARGV[2] partition key, ARGV[3] operator,
-- ARGV[4] now (ms), ARGV[5] category, ARGV[6] the groups it is replayed
-- to, separated by newlines ('' for the one that dead-lettered it)
--
-- The copy keeps the event's identity (message id and `origin`) and leaves
-- out the `dlq_*` fields; it carries a `replay` field, a JSON object: `by`
-- (the group that dead-lettered it) and `to` (the groups it is for). The
-- other groups acknowledge it without running it, so a replay reaches no
-- handler that was not named, and a named handler that applied the event
-- before recognises its origin (`AppliedEvents`), while the one that
-- dead-lettered it takes it as new. The key is put back into the index, as
-- a publish does, so a reaped partition is discovered again; the caller
-- then writes a wake-up so an idle owner wakes.
--
-- Returns {'missing'} when there is no such dead letter, {'empty'} when it
-- holds no envelope fields, {'wrong_key', key} when its envelope names
-- another key, {'no_group'} when it names no group and none was given,
-- {'unknown_group', group} for a group not registered for the category,
-- else {'ok', new entry id, audit id, dlq group, the groups replayed to
-- separated by newlines}.
local r = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #r == 0 then
  return {'missing'}
end
local flat = r[1][2]
local copy = {}
local group = ''
for j = 1, #flat, 2 do
  local name, value = flat[j], flat[j + 1]
  if string.sub(name, 1, 4) == 'dlq_' then
    if name == 'dlq_group' then
      group = value
    end
  elseif name ~= 'replay' then
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
local to = {}
if ARGV[6] == '' then
  if group == '' then
    return {'no_group'}
  end
  to[1] = group
else
  for g in string.gmatch(ARGV[6], '[^\n]+') do
    if redis.call('SISMEMBER', KEYS[6], g) == 0 then
      return {'unknown_group', g}
    end
    to[#to + 1] = g
  end
end
local replay = {to = to}
if group ~= '' then
  replay.by = group
end
copy[#copy + 1] = 'replay'
copy[#copy + 1] = cjson.encode(replay)
local id = redis.call('XADD', KEYS[2], '*', unpack(copy))
redis.call('INCRBY', KEYS[5], 1)
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[1])
local handlers = table.concat(to, '\n')
local audit = redis.call('XADD', KEYS[4], '*', 'op', 'replay', 'category',
  ARGV[5], 'key', ARGV[2], 'group', group, 'to', handlers, 'entry', id,
  'operator', ARGV[3], 'time', ARGV[4], 'forced', '0', 'stream', KEYS[2],
  'dlq_entry', ARGV[1])
return {'ok', id, audit, group, handlers}
