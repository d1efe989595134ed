-- Moves an entry an ordinary handler gave up on to the category's dead
-- letter stream and acknowledges it, together.
--
-- KEYS[1] stream, KEYS[2] dead letter stream
-- ARGV[1] group, ARGV[2] entry id, ARGV[3] error text, ARGV[4] now (ms),
-- ARGV[5..] the entry's fields and values
-- Returns {1, the dead letter's id}.
local fields = {}
for i = 5, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
fields[#fields + 1] = 'dlq_group'
fields[#fields + 1] = ARGV[1]
fields[#fields + 1] = 'dlq_source'
fields[#fields + 1] = KEYS[1]
fields[#fields + 1] = 'dlq_entry'
fields[#fields + 1] = ARGV[2]
fields[#fields + 1] = 'dlq_error'
fields[#fields + 1] = ARGV[3]
fields[#fields + 1] = 'dlq_time'
fields[#fields + 1] = ARGV[4]
local id = redis.call('XADD', KEYS[2], '*', unpack(fields))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return {1, id}
