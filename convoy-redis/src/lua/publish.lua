-- Publishes the records of a batch that belong to one shard, in order, in
-- one atomic script. Every key is in the shard (one hash slot) but the
-- wake streams: on one server the script writes the wake-ups of the keys
-- it wrote to (atomic with the records, no round trip of their own); on a
-- cluster the wake streams are in other slots, and the caller writes them
-- after, as hints.
--
-- KEYS[1]          the producer's published set in the shard: a sorted set
--                  of the seqs it published that may still be sent again,
--                  one member per call: the seqs the call wrote, joined by
--                  commas, scored by the largest (a member of one seq, as
--                  an older convoy wrote, reads the same)
-- KEYS[2]          the producer's epoch as the shard saw it (the newest
--                  publisher's fencing token)
-- KEYS[3]          the producer's last call in the shard (its id)
-- then per category c of the records (1 to C): its partition index in the
--                  shard, its count of partitioned publishes in the shard
--                  (for lag), as KEYS[2c+2] and KEYS[2c+3]
-- then, on one server, per category c its wake stream, as KEYS[2C+3+c]
--                  (none on a cluster)
-- then per run of records (below): its stream
-- ARGV[1]          producer keys TTL (ms); 0 keeps them for good (an
--                  elected relay's, whose successor must refuse a
--                  predecessor however late it wakes)
-- ARGV[2]          the producer's oldest record not settled yet (see
--                  below): the batch's first, or an earlier one of a batch
--                  still in flight
-- ARGV[3]          the publisher's epoch
-- ARGV[4]          C, the number of categories
-- ARGV[5]          the id of this call (unique per publisher process)
-- ARGV[6]          the id of the call this one was sent behind, while that
--                  one's reply had not come ('' for none)
-- ARGV[7]          the producer's name
-- ARGV[8]          W, the number of wake streams named (C or 0)
-- ARGV[9]          a wake stream's approximate length limit
-- then per run of records: its count n, its category number c, its
--                  partition key ('' when unpartitioned) and its shape,
--                  then per record its seq and fields. A run is records of
--                  one stream, in the batch's order, all of one shape: 'k'
--                  for convoy's usual entry (meta, payload, key: the run's
--                  key, origin: '{producer}#{seq}'), whose records send
--                  the values of meta and payload alone; 'f' for any other
--                  entry, whose records send the count of names and values
--                  that follow. Each argument costs Redis about a tenth of
--                  a microsecond (read, then made a Lua string), more than
--                  the rest of a record's work but its XADD, so what a
--                  record shares with its run or the call is sent once.
--                  The order of records of different streams does not
--                  matter (each key has its own stream, and the script is
--                  atomic), so a batch is sent as a run per stream.
--
-- Deduplication is by each record's own seq, not by a high-water mark: a
-- durable outbox commits rows out of seq order (a row of one key may commit
-- after a larger row of another), so "not above the mark" would drop it.
-- Every seq below ARGV[2] was settled in the outbox and can never be sent
-- again: the members whose seqs are all below it are dropped from the set,
-- which therefore holds about one batch (two while a batch is sent behind
-- another). A record whose seq is in the set
-- was published before (a re-sent batch after a lost reply or a crash) and
-- is skipped. A record always goes to the same shard, so the shard's set is
-- the one that knows. One member per call, not per seq: adding 128 members
-- to a sorted set cost Redis more than the 128 XADDs.
--
-- A publisher whose epoch is below the stored one was replaced (a stalled
-- relay whose leadership passed to another replica) and is refused. An
-- elected publisher raises its epoch in every shard with an empty batch
-- (the broker's take_over) before it reads a single pending row, so once
-- the successor may publish, every batch of its predecessor is refused by
-- the epoch, whatever the order of stalls and outages: the predecessor
-- cannot publish a row the successor read too, nor trim a row the
-- successor may still send out of the published set (a trim happens only
-- in an accepted batch, whose rows below its first were settled before
-- the successor read).
--
-- A publisher may send a batch behind one whose reply has not come yet
-- (pipelined, on one connection). Redis runs them in the order sent, but
-- the first may still fail where the second does not (an error reply, a
-- redirection followed again, a script loaded in between), and a record
-- written ahead of an earlier record of its key would reorder the key. So
-- a call sent behind another names it (ARGV[6]), and runs only if that one
-- was the producer's last call to run in the shard (KEYS[3]); else it
-- writes nothing and returns {0}, and its records are sent again, in
-- order, after the earlier ones.
-- Returns {1, the number of records written, the number of wake-up
-- entries that could not be written, then per category count touched: its
-- key, its new value, what the batch added}, {-1, the stored epoch} or {0}
-- (the call it was sent behind did not run).
-- Lua's unpack takes about 8000 values at most: a long list goes to its
-- command in chunks.
local function in_chunks(command, key, list)
  for from = 1, #list, 4000 do
    redis.call(command, key, unpack(list, from, math.min(from + 3999, #list)))
  end
end
local ttl = ARGV[1]
local epoch = tonumber(ARGV[3])
-- The stored epoch, and the producer's last call when this one was sent
-- behind another (one MGET: both keys are in the shard).
local behind = ARGV[6] ~= ''
local stored, last
if behind then
  local got = redis.call('MGET', KEYS[2], KEYS[3])
  stored, last = got[1], got[2]
else
  stored = redis.call('GET', KEYS[2])
end
stored = tonumber(stored or '0')
if epoch < stored then
  return {-1, stored}
end
if behind and last ~= ARGV[6] then
  return {0}
end
local forever = ttl == '0'
if epoch > stored then
  if forever then
    redis.call('SET', KEYS[2], epoch)
  else
    redis.call('SET', KEYS[2], epoch, 'PX', ttl)
  end
elseif stored > 0 and not forever then
  -- Kept as long as the producer publishes, so a replaced publisher is
  -- refused however long after it was replaced it wakes up.
  redis.call('PEXPIRE', KEYS[2], ttl)
end
if forever and #ARGV < 10 then
  -- A take-over (no records): keys kept with a TTL by an older convoy
  -- are kept for good from now on.
  redis.call('PERSIST', KEYS[1])
  redis.call('PERSIST', KEYS[2])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2])
local producer = ARGV[7]
local categories = tonumber(ARGV[4])
local wakes = tonumber(ARGV[8])
local a = 10
local written = 0
-- The key of the run before the first.
local i = 3 + 2 * categories + wakes
-- The largest seq in the set: a record above it needs no lookup.
local top = redis.call('ZRANGE', KEYS[1], 0, 0, 'REV', 'WITHSCORES')
local max = tonumber(top[2] or '-1')
-- The seqs published from the floor up, read once, when a record first
-- needs a lookup (a re-sent batch, or a row that committed late).
local known = nil
local sent = {}
local sent_max = -1
-- Index entries and counts once per distinct key (or category) of the
-- batch: the script is atomic, so doing them at the end is the same as
-- doing them with each record. One SADD per index, with all its keys
-- (indexed: per index, the keys seen).
local indexed = {}
local adds = {}
local indexes = {}
local category_of = {}
local counts = {}
while a <= #ARGV do
  local n = tonumber(ARGV[a])
  local c = tonumber(ARGV[a + 1])
  local key = ARGV[a + 2]
  local usual = ARGV[a + 3] == 'k'
  a = a + 4
  i = i + 1
  local stream = KEYS[i]
  local run_written = 0
  for _ = 1, n do
    local seq_text = ARGV[a]
    local seq = tonumber(seq_text)
    -- The record's arguments after its seq.
    local m = 2
    if not usual then
      m = 1 + tonumber(ARGV[a + 1])
    end
    local fresh = seq > max
    if not fresh then
      if not known then
        known = {}
        local calls = redis.call('ZRANGE', KEYS[1], ARGV[2], '+inf', 'BYSCORE')
        for _, member in ipairs(calls) do
          for published_seq in string.gmatch(member, '%d+') do
            known[published_seq] = true
          end
        end
      end
      fresh = not known[seq_text]
    end
    if fresh then
      if usual then
        redis.call('XADD', stream, '*', 'meta', ARGV[a + 1], 'payload', ARGV[a + 2],
          'key', key, 'origin', producer .. '#' .. seq_text)
      else
        redis.call('XADD', stream, '*', unpack(ARGV, a + 2, a + m))
      end
      sent[#sent + 1] = seq_text
      if seq > sent_max then
        sent_max = seq
      end
      run_written = run_written + 1
    end
    a = a + 1 + m
  end
  if run_written > 0 and key ~= '' then
    local index = KEYS[2 * c + 2]
    local published = KEYS[2 * c + 3]
    local seen = indexed[index]
    if not seen then
      seen = {}
      indexed[index] = seen
      adds[index] = {}
      indexes[#indexes + 1] = index
      category_of[index] = c
    end
    if not seen[key] then
      seen[key] = true
      local keys = adds[index]
      keys[#keys + 1] = key
    end
    counts[published] = (counts[published] or 0) + run_written
  end
  written = written + run_written
end
for _, index in ipairs(indexes) do
  in_chunks('SADD', index, adds[index])
end
-- The wake-ups: per category one entry naming each key written to
-- ('k', key, 'k', key2, ...), as the publisher writes them on a cluster.
-- A wake-up is a hint: one that cannot be written (its key holding
-- something else) fails nothing, since a script's error after its first
-- write would keep the records without their dedup entries, and a batch
-- sent again would write them twice; it is counted, and the publisher
-- warns. (The wake stream is one of the script's keys, so a user whose
-- ACL does not allow it is refused the whole call, before it runs.)
local wake_failures = 0
if wakes > 0 then
  for _, index in ipairs(indexes) do
    local wake = KEYS[2 * categories + 3 + category_of[index]]
    local keys = adds[index]
    for from = 1, #keys, 2000 do
      local fields = {}
      for j = from, math.min(from + 1999, #keys) do
        fields[#fields + 1] = 'k'
        fields[#fields + 1] = keys[j]
      end
      local r = redis.pcall('XADD', wake, 'MAXLEN', '~', ARGV[9], '*', unpack(fields))
      if type(r) == 'table' and r.err then
        wake_failures = wake_failures + 1
      end
    end
  end
end
-- Each count's new value and what this batch added: the publisher keeps
-- the last value it saw, and a later value below it means the shard lost
-- writes (a failover to a replica without them).
local out = {1, written, wake_failures}
for k, c in pairs(counts) do
  out[#out + 1] = k
  out[#out + 1] = redis.call('INCRBY', k, c)
  out[#out + 1] = c
end
if #sent > 0 then
  redis.call('ZADD', KEYS[1], sent_max, table.concat(sent, ','))
end
if not forever then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
-- This call ran, last: a call sent behind it may run now. Written at the
-- end, so a call that failed half-way (Redis keeps what a script wrote
-- before its error) is never taken as run.
if forever then
  redis.call('SET', KEYS[3], ARGV[5])
else
  redis.call('SET', KEYS[3], ARGV[5], 'PX', ttl)
end
return out
