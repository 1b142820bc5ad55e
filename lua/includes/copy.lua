--[[
  Naming and deleting a whole copy of a user (live or staging) by exact key names, for the repair
  scripts and the fingerprint (`user_keys.lua`). Never a pattern: see src/store/redis/keys.rs.
]]
-- DELs `names` in calls of at most 1,000 keys (Lua's unpack stops near 8,000 values); returns
-- how many existed.
local function del_all(names)
  local removed = 0
  for i = 1, #names, 1000 do
    removed = removed + redis.call('DEL', unpack(names, i, math.min(i + 999, #names)))
  end
  return removed
end

-- Every key one epoch of a copy may hold, named without trusting its meta or day set: the meta,
-- identity index and day set, and a day bucket for every day the day set or the meta's proofs
-- name AND every day of the retention window around today (`today - retention - 1` to
-- `today + future_window`). A day set or proof lost to damage can therefore not leave an orphan
-- bucket behind that a later ZADD would bring back to life. Bounded: <= 31 listed days plus
-- retention + future window + 2 window days.
local function epoch_key_names(keys, today, retention_days, future_window)
  local names = {keys.meta, keys.seqbucket, keys.days}
  local seen = {}
  local function add_day(day)
    if not seen[day] then
      seen[day] = true
      names[#names + 1] = keys.day_prefix .. day
    end
  end
  for day = today - retention_days - 1, today + future_window do
    add_day(string.format('%d', day))
  end
  if redis.call('TYPE', keys.days)['ok'] == 'zset' then
    for _, day in ipairs(redis.call('ZRANGE', keys.days, 0, -1)) do add_day(day) end
  end
  if redis.call('TYPE', keys.meta)['ok'] == 'hash' then
    for _, field in ipairs(redis.call('HKEYS', keys.meta)) do
      local day = string.match(field, '^bucket_max_seq:(.+)$') or
        string.match(field, '^bucket_expires_at:(.+)$')
      if day then add_day(day) end
    end
  end
  return names
end

-- Deletes a whole copy of a user: its epoch key and every key of the epoch it names (see
-- `epoch_key_names`). Returns how many keys existed.
local function delete_copy(stem, tag, epoch_key, today, retention_days, future_window)
  local epoch = false
  if redis.call('TYPE', epoch_key)['ok'] == 'string' then epoch = redis.call('GET', epoch_key) end
  local removed = 0
  if epoch then
    removed = del_all(epoch_key_names(epoch_keys(stem, tag, epoch), today, retention_days,
      future_window))
  end
  return removed + redis.call('DEL', epoch_key)
end

