-- Prepended to every fenced script (see scripts/mod.rs): the fence check.
-- (A script's functions are made again at every call: what only some
-- fenced scripts use is in entries.lua, which ack.lua, run for nearly every
-- event, goes without.)
--
-- A caller may act on a unit while its lease holds the caller's fence
-- token and the caller's liveness key holds the caller's incarnation.
-- Returns nil when it may, else why not:
--   -1  another owner holds the lease (fenced out)
--   -2  the lease is gone (an operator's --force, or Redis lost its state)
--   -3  the caller's liveness lapsed, or was renewed by another process
--       under the same instance id
-- `live` is what the caller's liveness key holds and `cur` what the lease
-- holds (false for a missing key), as read by the script: one MGET for
-- both, or for every unit of a call (scripts that check several units).
local function refusal_held(live, cur, token, inc)
  if live ~= inc then
    return -3
  end
  if cur == token then
    return nil
  end
  if cur == false then
    return -2
  end
  return -1
end

local function refusal(lease, token, alive, inc)
  local held = redis.call('MGET', alive, lease)
  return refusal_held(held[1], held[2], token, inc)
end
