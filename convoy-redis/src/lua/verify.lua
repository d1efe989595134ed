-- The check of a native read of new entries: on a unit of one stream, its
-- owner reads with a plain XREADGROUP (no reply passed through Lua) and
-- sends this script right behind it, in the same pipeline. The read itself
-- is not fenced, so this script is what makes it safe:
--
-- - The fence: the lease still holds the caller's token (a token is never
--   reused, so it held it since the lease was taken, and the read ran
--   while the caller owned the unit) and the liveness key its incarnation.
--   Refused, the caller handles nothing it read; the entries stay pending
--   for its consumer and the next owner's reclaim, or this check run by
--   the next owner, moves them.
-- - Reads by a replaced owner: one that stalled past its lease and read
--   natively after waking moved entries to its own consumer; its own check
--   refuses it, so nobody would handle them and the owner's reads would
--   pass over them. Any other consumer of the group holding entries of the
--   stream pending is such a read (the reclaim at takeover leaves none):
--   they are moved to the caller's consumer, and the caller reads its
--   pending entries, in order, before anything new.
-- - Lost replies: the caller compares what its consumer holds pending with
--   what it knows of (its handled entries not acknowledged yet plus what
--   this read delivered); more means an earlier read, or this one sent
--   twice by the client, delivered entries the caller never saw.
--
-- KEYS[1] lease, KEYS[2] stream, KEYS[3] the owner's liveness key
-- ARGV[1] fence token (the consumer name), ARGV[2] group,
-- ARGV[3] the owner's incarnation
--
-- Returns {refusal} (see fence.lua) when fenced out; {1, pending}: no
-- other consumer holds an entry pending, and how many this consumer holds
-- (0 too when the stream or its group does not exist: the read failed
-- then, and the caller falls back to the scripted read, which creates the
-- group); {0, deleted ids...}: other consumers' pending entries were moved
-- to this consumer (the ids are those whose entries no longer exist).
local no = refusal(KEYS[1], ARGV[1], KEYS[3], ARGV[3])
if no then
  return {no}
end
local p = redis.pcall('XPENDING', KEYS[2], ARGV[2])
if type(p) ~= 'table' or p.err then
  return {1, 0}
end
local own = 0
local others = false
for _, c in ipairs(p[4] or {}) do
  if c[1] == ARGV[1] then
    own = tonumber(c[2])
  else
    others = true
  end
end
if not others then
  return {1, own}
end
local _, deleted = claim_all(KEYS[2], ARGV[2], ARGV[1])
local out = {0}
for _, id in ipairs(deleted) do
  out[#out + 1] = id
end
return out
