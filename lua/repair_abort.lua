--[[
  Abandons a repair: removes the staging copy and lifts the fence if this repair still holds it.
  The live copy is never touched. When the fence lapsed and nobody took it, the staging copy is
  an orphan and is removed too; when another repair holds the fence, the staging copy is that
  repair's and stays.

  KEYS[1]  P:repair:{user}     KEYS[2]  P:stgepoch:{user}
  ARGV[1]  the repair's holder id   ARGV[2]  staging stem `P:stg`   ARGV[3]  hash tag {user}
  ARGV[4]  retention_days           ARGV[5]  future_window_days

  Returns {1, staging keys removed}, or {0, 0} when another repair holds the fence.
]]
local current = redis.call('GET', KEYS[1])
if current and current ~= ARGV[1] then return {0, 0} end
local today = math.floor(now_seconds() / 86400)
local removed = delete_copy(ARGV[2], ARGV[3], KEYS[2], today, tonumber(ARGV[4]), tonumber(ARGV[5]))
if current then redis.call('DEL', KEYS[1]) end
return {1, removed}
