-- Lets a drained unit rest: its owner's consumer is deleted from each of
-- the unit's streams where it has nothing pending (a drained partition
-- then keeps its stream and consumer group but no consumer: about a
-- quarter of its Redis memory). The owner's next read creates the
-- consumer again (XREADGROUP does), so nothing else changes.
--
-- KEYS[1] lease, KEYS[2 .. n+1] the unit's streams, KEYS[n+2] the owner's
-- liveness key
-- ARGV[1] fence token (also the consumer name), ARGV[2] group,
-- ARGV[3] the owner's incarnation
--
-- A consumer with entries pending (handled but not acknowledged yet, or
-- delivered by a read whose reply was lost) is kept: deleting it would
-- drop them from the pending list.
--
-- Returns {refusal} (see fence.lua) when fenced out, else {1, consumers
-- deleted}.
local no = refusal(KEYS[1], ARGV[1], KEYS[#KEYS], ARGV[3])
if no then
  return {no}
end
local deleted = 0
for i = 2, #KEYS - 1 do
  local stream = KEYS[i]
  if redis.call('EXISTS', stream) == 1 then
    -- A stream without the group yet (NOGROUP) is left alone.
    local pending = redis.pcall('XPENDING', stream, ARGV[2], '-', '+', 1, ARGV[1])
    if type(pending) == 'table' and pending.err == nil and #pending == 0 then
      redis.call('XGROUP', 'DELCONSUMER', stream, ARGV[2], ARGV[1])
      deleted = deleted + 1
    end
  end
end
return {1, deleted}
