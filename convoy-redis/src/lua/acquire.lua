-- Tries to take the leases of several units at once.
--
-- A unit's lease holds the fence token `{owner}:{gen}`; it is valid while
-- the owner's liveness key `convoy:alive:{group}:{owner}` holds the
-- incarnation the owner had when it took the lease (recorded as `inc` in
-- the unit's state hash). The liveness key is renewed every heartbeat, so
-- renewing costs one command however many units an instance owns; an
-- instance whose liveness lapsed registers again under a new incarnation,
-- so the leases it held before are dead for everyone, even though its
-- liveness key exists again.
--
-- KEYS[3i-2], KEYS[3i-1], KEYS[3i]  unit i: its lease key, its state hash,
--                       and the liveness key of the owner the caller saw
--                       holding the lease (the caller's own when it saw
--                       none, or itself: never '', which a Redis ACL user
--                       limited to convoy's keys may not name)
-- KEYS[#KEYS]           the caller's own liveness key
-- ARGV[1]               the owner id (this engine instance)
-- ARGV[2]               the most units to take in this call
-- ARGV[3]               the caller's incarnation
-- ARGV[3+i]             the owner the caller saw holding unit i's lease
--                       ('' when it saw none, or itself)
--
-- Every key the script touches is in KEYS, so the caller reads the leases
-- first to name the holders' liveness keys. The script checks again that
-- each lease still names the holder the caller saw: a lease that changed
-- hands since (to an owner whose liveness key is not in KEYS) counts as
-- held, and the caller tries again later.
--
-- The caller must be alive itself (its liveness key holds its
-- incarnation): a lapsed instance takes nothing (returns {-3}, as the
-- fence would refuse it) and must register again first.
--
-- A unit is free when it has no lease, or its lease's owner is no longer
-- alive in the incarnation that took it; it is then taken at the next
-- generation. A lease still held by this same owner (left by an earlier
-- worker that gave up) is taken over at a new generation too, so the new
-- worker reclaims what the old one left pending.
--
-- Generations never repeat, even when the unit's state was lost (Redis
-- restarted without persistence, the key evicted or deleted): the next
-- generation is the stored one plus one, but never below the Redis clock
-- in microseconds (one unit is never taken twice in a microsecond, so a
-- generation never runs ahead of the clock; this holds as long as the Redis
-- host's clock does not step back). Returned as strings.
--
-- Returns {1, per unit: {token, halted, head, attempts} when taken, or
-- {false, holder} when held by a live owner or over the limit}.
local me = KEYS[#KEYS]
if redis.call('GET', me) ~= ARGV[3] then
  return {-3}
end
local out = {}
local taken = 0
local max = tonumber(ARGV[2])
local prefix = ARGV[1] .. ':'
local t = redis.call('TIME')
local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
for i = 1, (#KEYS - 1) / 3 do
  local lease, state, alive = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local seen = ARGV[3 + i]
  local cur = redis.call('GET', lease)
  local free = true
  if cur and string.sub(cur, 1, #prefix) ~= prefix then
    local owner = string.match(cur, '^(.*):%d+$')
    if owner then
      if owner ~= seen or seen == '' then
        -- Changed hands since the caller looked: held, for now.
        free = false
      else
        local inc = redis.call('HGET', state, 'inc')
        local live = redis.call('GET', alive)
        if live and (inc == false or live == inc) then
          free = false
        end
      end
    end
  end
  if taken >= max or not free then
    out[#out + 1] = {false, cur or ''}
  else
    local gen = tonumber(redis.call('HGET', state, 'gen') or '0') + 1
    if gen < clock then
      gen = clock
    end
    gen = string.format('%.0f', gen)
    local token = prefix .. gen
    redis.call('HSET', state, 'gen', gen, 'inc', ARGV[3])
    redis.call('SET', lease, token)
    local s = redis.call('HMGET', state, 'halted', 'head', 'attempts')
    out[#out + 1] = {token, s[1] or '', s[2] or '', s[3] or '0'}
    taken = taken + 1
  end
end
return {1, out}
