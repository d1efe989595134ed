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
--   pending entries, in order, before anything new. (read.lua looks too,
--   before every read: a read whose check never ran is followed by one.)
-- - Lost replies: the caller compares what its consumer holds pending with
--   what it knows of (its handled entries not acknowledged yet, a batch it
--   holds while it reads ahead, plus what this read delivered), and the
--   oldest pending id with the oldest it holds. More means an earlier read,
--   or this one sent twice by the client, delivered entries the caller
--   never saw; any difference sends the caller to its pending entries
--   first. (The oldest id tells a read that ran before the caller
--   acknowledged what it holds from one that ran after, when as many
--   unseen entries make up the count.)
--
-- KEYS[1] lease, KEYS[2] stream, KEYS[3] the owner's liveness key
-- ARGV[1] fence token (the consumer name), ARGV[2] group,
-- ARGV[3] the owner's incarnation
--
-- Returns {refusal} (see fence.lua) when fenced out; {2, ...} (see
-- moved_back in fence.lua) when other consumers held entries; else
-- {1, pending, oldest}: how many entries this consumer holds pending (0
-- too when the stream or its group does not exist: the read failed then,
-- and the caller falls back to the scripted read, which creates the
-- group), and the oldest one's id ('' for none).
local no = refusal(KEYS[1], ARGV[1], KEYS[3], ARGV[3])
if no then
  return {no}
end
local own, others, oldest = pending_of(KEYS[2], ARGV[2], ARGV[1])
if others then
  return moved_back(KEYS[2], ARGV[2], ARGV[1], own)
end
return {1, own, oldest or ''}
