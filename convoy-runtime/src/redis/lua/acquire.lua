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
-- KEYS[2i-1], KEYS[2i]  unit i: its lease key and its state hash
-- KEYS[#KEYS]           the caller's own liveness key
-- ARGV[1]               the owner id (this engine instance)
-- ARGV[2]               the most units to take in this call
-- ARGV[3]               the consumer group (names the holders' liveness keys)
-- ARGV[4]               the caller's incarnation
--
-- The caller must be alive itself (its liveness key holds its
-- incarnation): a lapsed instance takes nothing (returns {-1}) and must
-- register again first.
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
if redis.call('GET', me) ~= ARGV[4] then
  return {-1}
end
local out = {}
local taken = 0
local max = tonumber(ARGV[2])
local prefix = ARGV[1] .. ':'
local t = redis.call('TIME')
local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
for i = 1, #KEYS - 1, 2 do
  local lease, state = KEYS[i], KEYS[i + 1]
  local cur = redis.call('GET', lease)
  local free = true
  if cur and string.sub(cur, 1, #prefix) ~= prefix then
    local owner = string.match(cur, '^(.*):%d+$')
    if owner then
      local inc = redis.call('HGET', state, 'inc')
      local live = redis.call('GET', 'convoy:alive:' .. ARGV[3] .. ':' .. owner)
      if live and (inc == false or live == inc) then
        free = false
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
    redis.call('HSET', state, 'gen', gen, 'inc', ARGV[4])
    redis.call('SET', lease, token)
    local s = redis.call('HMGET', state, 'halted', 'head', 'attempts')
    out[#out + 1] = {token, s[1] or '', s[2] or '', s[3] or '0'}
    taken = taken + 1
  end
end
return {1, out}
