-- Tries to take the leases of several units at once.
--
-- A unit's lease holds the fence token `{owner}:{gen}`; it is valid while
-- the owner's liveness key `convoy:alive:{group}:{owner}` exists (one key
-- per instance, renewed every heartbeat, so renewing costs one command
-- however many units an instance owns).
--
-- KEYS[2i-1], KEYS[2i]  unit i: its lease key and its state hash
-- ARGV[1]               the owner id (this engine instance)
-- ARGV[2]               the most units to take in this call
-- ARGV[3]               the consumer group (names the liveness keys)
--
-- A unit is free when it has no lease, or its lease's owner is no longer
-- alive; it is then taken at the next generation (the durable counter
-- `gen` in the state hash). A lease still held by this same owner (left by
-- an earlier worker that gave up) is taken over at a new generation too,
-- so the new worker reclaims what the old one left pending.
-- Returns per unit: {token, halted, head, attempts} when taken, or
-- {false, holder} when held by a live owner or over the limit.
local out = {}
local taken = 0
local max = tonumber(ARGV[2])
local prefix = ARGV[1] .. ':'
for i = 1, #KEYS, 2 do
  local lease, state = KEYS[i], KEYS[i + 1]
  local cur = redis.call('GET', lease)
  local free = true
  if cur and string.sub(cur, 1, #prefix) ~= prefix then
    local owner = string.match(cur, '^(.*):%d+$')
    if owner and redis.call('EXISTS', 'convoy:alive:' .. ARGV[3] .. ':' .. owner) == 1 then
      free = false
    end
  end
  if taken >= max or not free then
    out[#out + 1] = {false, cur or ''}
  else
    local gen = redis.call('HINCRBY', state, 'gen', 1)
    local token = prefix .. gen
    redis.call('SET', lease, token)
    local s = redis.call('HMGET', state, 'halted', 'head', 'attempts')
    out[#out + 1] = {token, s[1] or '', s[2] or '', s[3] or '0'}
    taken = taken + 1
  end
end
return out
