--[[
  Garbage collection of one user's staging copy (the patrol): removed only when no fence exists,
  i.e. the repair that built it crashed or was killed and its lease lapsed. A staging copy under
  a fence belongs to a repair in progress and stays.

  KEYS[1]  P:repair:{user}     KEYS[2]  P:stgepoch:{user}
  ARGV[1]  staging stem `P:stg`   ARGV[2]  hash tag {user}
  ARGV[3]  retention_days         ARGV[4]  future_window_days
  ARGV[5]  1: dry run (decide, remove nothing), 0: collect

  Returns {1, staging keys removed} (a dry run: {1, 0}), or {0, 0} when there was nothing to
  collect.
]]
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 0 then return {0, 0} end
if ARGV[5] == '1' then return {1, 0} end
local today = math.floor(now_seconds() / 86400)
return {1, delete_copy(ARGV[1], ARGV[2], KEYS[2], today, tonumber(ARGV[3]), tonumber(ARGV[4]))}
