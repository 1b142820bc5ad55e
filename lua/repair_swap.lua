--[[
  The one atomic step of a repair (SPEC 7.1): if the repair still holds the fence, delete every
  live key of the user, rename the staging copy to the live names (TTLs travel with RENAME) and
  lift the fence. Otherwise nothing changes.

  KEYS[1]  P:repair:{user}     KEYS[2]  P:epoch:{user}     KEYS[3]  P:stgepoch:{user}

  ARGV[1]  the repair's holder id   ARGV[2]  live key stem `P:`   ARGV[3]  staging stem `P:stg`
  ARGV[4]  hash tag {user}          ARGV[5]  retention_days       ARGV[6]  future_window_days

  Returns {0, staged_groups, live keys removed}, or ERR_FENCE_LOST holder-or-''.

  Live keys deleted: the epoch key, and for the live epoch and the staged epoch (when they
  differ) the meta, identity index, day set and every day bucket the day set or meta names or the
  retention window holds (`epoch_key_names`), so no orphan bucket of a damaged mailbox survives.
  Work: two epochs of at most retention + future window + 33 keys each, plus the same for the
  staging copy's renames.
]]
local fence, live_epoch_key, staging_epoch_key = KEYS[1], KEYS[2], KEYS[3]
local holder, live_stem, staging_stem, tag = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local retention_days, future_window = tonumber(ARGV[5]), tonumber(ARGV[6])

local current = redis.call('GET', fence)
if current ~= holder then return {ERR_FENCE_LOST, current or ''} end

local now = now_seconds()
local today = math.floor(now / 86400)
local function epoch_of(key)
  if redis.call('TYPE', key)['ok'] == 'string' then return redis.call('GET', key) end
  return false
end
local live_epoch = epoch_of(live_epoch_key)
local staged_epoch = epoch_of(staging_epoch_key)

-- 1. Every live key of the user goes.
local removed = 0
if live_epoch then
  removed = removed + del_all(epoch_key_names(epoch_keys(live_stem, tag, live_epoch), today,
    retention_days, future_window))
end
if staged_epoch and staged_epoch ~= live_epoch then
  removed = removed + del_all(epoch_key_names(epoch_keys(live_stem, tag, staged_epoch), today,
    retention_days, future_window))
end
removed = removed + redis.call('DEL', live_epoch_key)

-- 2. The staging copy becomes the live one, key by key under the same names after the stem.
local staged_groups = 0
if staged_epoch then
  local from = epoch_keys(staging_stem, tag, staged_epoch)
  staged_groups = redis.call('ZCOUNT', from.seqbucket, '(' .. now, '+inf')
  local names = epoch_key_names(from, today, retention_days, future_window)
  for _, name in ipairs(names) do
    if redis.call('EXISTS', name) == 1 then
      redis.call('RENAME', name, live_stem .. string.sub(name, #staging_stem + 1))
    end
  end
  redis.call('RENAME', staging_epoch_key, live_epoch_key)
end
redis.call('DEL', staging_epoch_key)
redis.call('DEL', fence)
return {0, staged_groups, removed}
