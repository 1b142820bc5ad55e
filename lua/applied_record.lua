--[[
  The store's record of how far it holds each partition of the log (store/redis/applied.rs),
  raised only where the store has not gone back: a field found below the floor the caller
  recorded itself last (and the store acknowledged) means the store lost writes since (a
  failover to a replica that missed them), so it is left as it is, as the evidence the next
  owner's check reads, and named in the answer. A field that is absent is written.

  KEYS[1]  P:applied:{T}
  ARGV     per partition, three: field `topic|partition`, the offset to record, the floor
           (the caller's last acknowledged record of it, or '' for none)

  Returns {field, held, field, held, ...}: the fields found below their floor, with what they
  hold (nothing was written for them); empty when every field was written.
]]
local behind = {}
for i = 1, #ARGV, 3 do
  local field, offset, floor = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local held = redis.call('HGET', KEYS[1], field)
  if floor ~= '' and held and tonumber(held) < tonumber(floor) then
    behind[#behind + 1] = field
    behind[#behind + 1] = held
  else
    redis.call('HSET', KEYS[1], field, offset)
  end
end
return behind
