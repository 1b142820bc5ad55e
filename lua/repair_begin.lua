--[[
  Takes the repair fence of a user (SPEC 7.1) and clears whatever staging copy an earlier, aborted
  repair of the user left behind, so the rebuild starts from nothing. Never touches the live copy.

  KEYS[1]  P:repair:{user}     the fence
  KEYS[2]  P:stgepoch:{user}   the staging epoch key (names the rest of the staging copy)

  ARGV[1]  the repair's holder id          ARGV[2]  lease in milliseconds
  ARGV[3]  staging key stem `P:stg`        ARGV[4]  hash tag {user}
  ARGV[5]  retention_days                  ARGV[6]  future_window_days

  Returns {0, staging keys removed}, or ERR_UNDER_REPAIR holder when a fence exists (another
  repair whose lease has not lapsed: Redis expires the key by its own clock).
]]
local holder = redis.call('GET', KEYS[1])
if holder then return {ERR_UNDER_REPAIR, holder} end
local today = math.floor(now_seconds() / 86400)
local removed = delete_copy(ARGV[3], ARGV[4], KEYS[2], today, tonumber(ARGV[5]), tonumber(ARGV[6]))
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {0, removed}
