-- Publishes a batch of outbox records, in order, atomically per record.
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
-- re-sent batch after a lost reply) and is skipped. The stream write, the
-- index write and the wake-up of one record happen together.
-- Returns the number of records written.
local mark = tonumber(redis.call('GET', KEYS[1]) or '0')
local a = 3
local written = 0
local i = 0
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
      redis.call('SADD', index, key)
      redis.call('XADD', wake, 'MAXLEN', '~', ARGV[2], '*', 'k', key)
      redis.call('INCR', published)
    end
    mark = seq
    redis.call('SET', KEYS[1], seq, 'PX', ARGV[1])
    written = written + 1
  end
end
return written
