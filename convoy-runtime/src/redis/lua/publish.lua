-- Publishes a batch of outbox records, in order, in one atomic script.
--
-- KEYS[1]          the producer's high-water mark (last published outbox seq)
-- KEYS[4i-2..4i+1] record i: its stream, its category's partition index,
--                  its category's wake stream, its category's count of
--                  partitioned publishes (for lag)
-- ARGV[1]          producer mark TTL (ms)
-- ARGV[2]          wake stream approximate max length
-- then per record: seq, partition key ('' when unpartitioned), field count,
--                  fields and values
--
-- A record whose seq is not above the mark was already published (a
-- re-sent batch after a lost reply) and is skipped. The stream writes, the
-- index entries and the wake-ups of a batch happen together.
-- Returns {1, the number of records written}.
local mark = tonumber(redis.call('GET', KEYS[1]) or '0')
local first_mark = mark
local a = 3
local written = 0
local i = 0
-- Index entries, wake-ups and counts once per distinct key (or category)
-- of the batch: the script is atomic, so doing them at the end is the same
-- as doing them with each record.
local woken = {}
local wakes = {}
local counts = {}
while a <= #ARGV do
  local seq = tonumber(ARGV[a])
  local key = ARGV[a + 1]
  local n = tonumber(ARGV[a + 2])
  local fields = {}
  for j = 1, n do
    fields[j] = ARGV[a + 2 + j]
  end
  a = a + 3 + n
  local stream = KEYS[4 * i + 2]
  local index = KEYS[4 * i + 3]
  local wake = KEYS[4 * i + 4]
  local published = KEYS[4 * i + 5]
  i = i + 1
  if seq > mark then
    redis.call('XADD', stream, '*', unpack(fields))
    if key ~= '' then
      local id = wake .. '\0' .. key
      if not woken[id] then
        woken[id] = true
        wakes[#wakes + 1] = {index, wake, key}
      end
      counts[published] = (counts[published] or 0) + 1
    end
    mark = seq
    written = written + 1
  end
end
for _, w in ipairs(wakes) do
  redis.call('SADD', w[1], w[3])
  redis.call('XADD', w[2], 'MAXLEN', '~', ARGV[2], '*', 'k', w[3])
end
for k, c in pairs(counts) do
  redis.call('INCRBY', k, c)
end
if mark > first_mark then
  redis.call('SET', KEYS[1], mark, 'PX', ARGV[1])
end
return {1, written}
