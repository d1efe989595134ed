-- Tries to take the leases of several units at once.
--
-- KEYS[2i-1], KEYS[2i]  unit i: its lease key and its state hash
-- ARGV[1]               the owner id (this engine instance)
-- ARGV[2]               lease TTL (ms)
-- ARGV[3]               the most units to take in this call
--
-- A free lease is taken at the next generation (the durable counter `gen`
-- in the state hash); the fence token is `{owner}:{gen}`. A lease still held
-- by this same owner (left by an earlier worker that gave up while Redis was
-- unreachable) is taken over at a new generation too, so the new worker
-- reclaims what the old one left pending.
-- Returns per unit: {token, halted, head, attempts} when taken, or
-- {false, holder} when held by someone else or over the limit.
local out = {}
local taken = 0
local max = tonumber(ARGV[3])
local prefix = ARGV[1] .. ':'
for i = 1, #KEYS, 2 do
  local lease, state = KEYS[i], KEYS[i + 1]
  local cur = redis.call('GET', lease)
  if taken >= max or (cur and string.sub(cur, 1, #prefix) ~= prefix) then
    out[#out + 1] = {false, cur or ''}
  else
    local gen = redis.call('HINCRBY', state, 'gen', 1)
    local token = prefix .. gen
    redis.call('SET', lease, token, 'PX', ARGV[2])
    local s = redis.call('HMGET', state, 'halted', 'head', 'attempts')
    out[#out + 1] = {token, s[1] or '', s[2] or '', s[3] or '0'}
    taken = taken + 1
  end
end
return out
