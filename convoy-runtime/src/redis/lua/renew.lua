-- Renews every lease an instance holds for one consumer group, in one call.
--
-- KEYS[2i-1], KEYS[2i]  unit i: its lease key and its state hash
-- ARGV[1]               lease TTL (ms)
-- ARGV[1+i]             unit i's fence token
--
-- Returns per unit: 0 lost (held by another token or expired), 1 renewed,
-- 2 renewed and halted.
local out = {}
for i = 1, #KEYS, 2 do
  local token = ARGV[1 + (i + 1) / 2]
  if redis.call('GET', KEYS[i]) == token then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    if redis.call('HGET', KEYS[i + 1], 'halted') == '1' then
      out[#out + 1] = 2
    else
      out[#out + 1] = 1
    end
  else
    out[#out + 1] = 0
  end
end
return out
