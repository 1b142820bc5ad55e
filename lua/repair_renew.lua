--[[
  Extends a repair's fence by a lease from now (server time), only while the repair still holds
  it. A fence that lapsed is never taken back: live writes may have gone through meanwhile.

  KEYS[1]  P:repair:{user}
  ARGV[1]  the repair's holder id   ARGV[2]  lease in milliseconds

  Returns {0}, or ERR_FENCE_LOST holder-or-'' when the fence is gone or someone else's.
]]
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then return {ERR_FENCE_LOST, current or ''} end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {0}
