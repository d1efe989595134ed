-- Reclaim on takeover: moves every pending entry of the unit's stream, left
-- by earlier generations, to this generation's consumer, then deletes the
-- old consumers that have nothing pending.
--
-- KEYS[1] lease, KEYS[2] stream, KEYS[3] the owner's liveness key
-- ARGV[1] fence token (the consumer name), ARGV[2] group,
-- ARGV[3] the owner's incarnation
--
-- Returns {refusal} (see fence.lua) when fenced out, {-4, type} when the
-- stream's key holds something other than a stream, else
-- {1, claimed, deleted ids...}: the number of entries now pending for this
-- consumer, and the ids that were pending but whose entries no longer
-- exist (XAUTOCLAIM drops them from the pending list; the caller reports
-- them, it never skips them silently).
local no = refusal(KEYS[1], ARGV[1], KEYS[#KEYS], ARGV[3])
if no then
  return {no}
end
local wrong = not_a_stream(KEYS[2])
if wrong then
  return {-4, wrong}
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  return {1, 0}
end
redis.pcall('XGROUP', 'CREATE', KEYS[2], ARGV[2], '0')
local n, deleted = claim_all(KEYS[2], ARGV[2], ARGV[1])
local out = {1, n}
for _, id in ipairs(deleted) do
  out[#out + 1] = id
end
return out
