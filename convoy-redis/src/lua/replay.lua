-- Operator replay of a dead letter: its original envelope goes back to the
-- partition's tail, as a new entry after everything already there, and the
-- dead letter is removed, together. Every group reading the category
-- receives it again.
--
-- KEYS[1] the key's dead letter stream, KEYS[2] the partition stream,
-- KEYS[3] the category's partition index in the shard, KEYS[4] the shard's
-- audit stream, KEYS[5] the category's published count in the shard
-- (`convoy_lag` is published - acknowledged: the replayed entry is one
-- more to handle); all in the key's shard
-- ARGV[1] dead letter id, ARGV[2] partition key, ARGV[3] operator,
-- ARGV[4] now (ms), ARGV[5] category
--
-- The copy leaves out the `dlq_*` fields and the `origin` (the event's
-- outbox and seq): the replayed entry comes after later events of its key
-- on purpose, and a handler's exactly-once record (which orders a key's
-- events by origin) must take it as new, by its new entry id. The key is put back into the
-- index, as a publish does, so a reaped partition is discovered again; the
-- caller then writes a wake-up so an idle owner wakes.
--
-- Returns {'missing'} when there is no such dead letter, {'empty'} when it
-- holds no envelope fields, {'wrong_key', key} when its envelope names
-- another key, else {'ok', new entry id, audit id, dlq group}.
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
  elseif name ~= 'origin' then
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
local id = redis.call('XADD', KEYS[2], '*', unpack(copy))
redis.call('INCRBY', KEYS[5], 1)
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[1])
local audit = redis.call('XADD', KEYS[4], '*', 'op', 'replay', 'category',
  ARGV[5], 'key', ARGV[2], 'group', group, 'entry', id, 'operator', ARGV[3],
  'time', ARGV[4], 'forced', '0', 'stream', KEYS[2], 'dlq_entry', ARGV[1])
return {'ok', id, audit, group}
