--[[
  Shared helpers of every mailbox script: time, seq arithmetic on 16-digit strings, error codes,
  key building for other epochs, meta creation and the identity index hygiene.

  Seqs go up to 9,999,999,999,999,999, beyond the 2^53 a Lua number holds exactly, so seqs are
  handled as strings: stored as 16-digit members (`member16`) and compared zero-padded to 20
  digits (`pad`, wide enough for any u64 cursor a caller passes), which order like the numbers.
]]
local rcall = redis.call

-- Error codes, mirrored by `ScriptCode` in src/store/redis/scripts.rs.
local ERR_FUTURE = -1
local ERR_SPAN = -2
local ERR_CROSS_DAY = -3
local ERR_UNSUPPORTED_FORMAT = -10
local ERR_INDEX_LOST = -11
local ERR_META_LOST = -12
local ERR_IDENTITY_MISSING = -13
local ERR_BAD_PROOF = -14
local ERR_EPOCH_MISMATCH = -20
local ERR_CURSOR_TRIMMED = -30
local ERR_CURSOR_GAP = -31
local ERR_UNDER_REPAIR = -40
local ERR_FENCE_LOST = -41

-- The repair fence (SPEC 7.1) guards both copies of a user. A live write (`holder` empty) is
-- refused while ANY fence exists; a staged write (`holder` = the repair's id) goes only while
-- that repair still holds the fence. Checked before anything is read or written. Returns nil
-- when the write may go, else the reply to return as it is.
local function fence_gate(repair_key, holder)
  local current = rcall('GET', repair_key)
  if holder == '' then
    if current then return {ERR_UNDER_REPAIR, current} end
  elseif current ~= holder then
    return {ERR_FENCE_LOST, current or ''}
  end
  return nil
end

-- Durable before commit (store.redis.wait_replicas > 0): the caller sends `WAIT` right after the
-- script, on the same connection. WAIT covers this connection's last write that was propagated
-- to replicas; a script that wrote nothing (an identical replay, a trim, a refusal) propagates
-- nothing, so on a fresh connection its WAIT would prove nothing about the write its answer
-- relies on. Rewriting the epoch key with its own value always propagates (SET does), and being
-- later in the replication stream than every write the answer read, its acknowledgement covers
-- them all. A user without an epoch key has nothing stored to cover.
local function propagate_for_wait(epoch_key)
  local current = rcall('GET', epoch_key)
  if current then rcall('SET', epoch_key, current) end
end

local FORMAT_VERSION = '4'

-- Current Unix second from the server's own clock: the only "now" a script uses.
local function now_seconds()
  return tonumber(rcall('TIME')[1])
end

-- A decimal seq (padded or not) as 20 digits, for comparisons.
local function pad(seq)
  return string.rep('0', 20 - #seq) .. seq
end

-- A decimal seq as the 16-digit member of the identity index and the bucket members.
local function member16(seq)
  return string.rep('0', 16 - #seq) .. seq
end

-- A 16-digit seq back to plain decimal ('0' for zero).
local function unpad(seq16)
  local s = string.gsub(seq16, '^0+', '')
  if s == '' then return '0' end
  return s
end

-- The larger of two plain decimal seqs.
local function seq_max(a, b)
  if pad(a) >= pad(b) then return a end
  return b
end

-- True when `s` is a plain decimal of at most 16 digits.
local function is_seq(s)
  return type(s) == 'string' and #s >= 1 and #s <= 16 and string.match(s, '^%d+$') ~= nil
end

-- Keys of one epoch of a copy of the user (same hash tag, so the same slot). `stem` is `P:` for
-- the live copy and `P:stg` for a repair's staging copy (see src/store/redis/keys.rs).
local function epoch_keys(stem, tag, epoch)
  local suffix = tag .. ':' .. epoch
  return {
    meta = stem .. 'mbmeta:' .. suffix,
    seqbucket = stem .. 'mbseqbucket:' .. suffix,
    days = stem .. 'mbdays:' .. suffix,
    day_prefix = stem .. 'mbday:' .. suffix .. ':',
  }
end

-- Deletes every key of one epoch: bounded by the day set (<= 31 buckets) plus three keys.
local function delete_epoch(keys)
  local days = rcall('ZRANGE', keys.days, 0, -1)
  for _, day in ipairs(days) do
    rcall('DEL', keys.day_prefix .. day)
  end
  rcall('DEL', keys.meta, keys.seqbucket, keys.days)
end

-- ZADDs every member of `members` with one score, in calls of at most 1,000 pairs: Lua 5.1's
-- unpack stops near 8,000 values, and a group may hold 10,000 events (MAX_EVENTS_PER_GROUP).
local function zadd_all(key, score, members)
  for i = 1, #members, 1000 do
    local args = {}
    for j = i, math.min(i + 999, #members) do
      args[#args + 1] = score
      args[#args + 1] = members[j]
    end
    rcall('ZADD', key, unpack(args))
  end
end

-- ZREMs every member of `members`, in calls of at most 1,000 members (see `zadd_all`).
local function zrem_all(key, members)
  for i = 1, #members, 1000 do
    rcall('ZREM', key, unpack(members, i, math.min(i + 999, #members)))
  end
end

-- DELs `names` in calls of at most 1,000 keys (Lua's unpack stops near 8,000 values); returns
-- how many existed.
local function del_all(names)
  local removed = 0
  for i = 1, #names, 1000 do
    removed = removed + rcall('DEL', unpack(names, i, math.min(i + 999, #names)))
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
  if rcall('TYPE', keys.days)['ok'] == 'zset' then
    for _, day in ipairs(rcall('ZRANGE', keys.days, 0, -1)) do add_day(day) end
  end
  if rcall('TYPE', keys.meta)['ok'] == 'hash' then
    for _, field in ipairs(rcall('HKEYS', keys.meta)) do
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
  if rcall('TYPE', epoch_key)['ok'] == 'string' then epoch = rcall('GET', epoch_key) end
  local removed = 0
  if epoch then
    removed = del_all(epoch_key_names(epoch_keys(stem, tag, epoch), today, retention_days,
      future_window))
  end
  return removed + rcall('DEL', epoch_key)
end

-- Creates a V4 meta if the mailbox has none.
local function ensure_meta(meta_key)
  if rcall('EXISTS', meta_key) == 0 then
    rcall('HSET', meta_key,
      'retention_format_version', FORMAT_VERSION,
      'active_day_count', '0',
      'expired_gap_boundary', '0',
      'seqbucket_max_seq', '0',
      'user_trim_seq', '0')
  end
end

-- SPEC 4.2.4: nil when the meta is absent or V4, else the error reply.
local function check_format(meta_key)
  if rcall('EXISTS', meta_key) == 0 then return nil end
  local found = rcall('HGET', meta_key, 'retention_format_version')
  if found ~= FORMAT_VERSION then
    return {ERR_UNSUPPORTED_FORMAT, found or ''}
  end
  return nil
end

-- Reads a numeric meta field that must be a plain decimal seq; nil, err on damage.
local function meta_seq(meta_key, field)
  local v = rcall('HGET', meta_key, field)
  if v == false or v == nil then return '0', nil end
  if not is_seq(v) then
    return nil, {ERR_BAD_PROOF, 'meta field ' .. field .. ' is not a seq: ' .. v}
  end
  return v, nil
end

-- Drops identity members whose expiry has passed, and repairs a TTL-less index to its largest
-- score (never to now + N).
local function identity_hygiene(seqbucket_key, now)
  rcall('ZREMRANGEBYSCORE', seqbucket_key, '-inf', now)
  if rcall('TTL', seqbucket_key) == -1 then
    local top = rcall('ZRANGE', seqbucket_key, 0, 0, 'REV', 'WITHSCORES')
    if top[2] then
      rcall('EXPIREAT', seqbucket_key, top[2])
    end
  end
end

-- SPEC 4.2.6: nil when the meta and the identity index agree, else the error reply.
local function check_integrity(meta_key, seqbucket_key, now)
  local meta_exists = rcall('EXISTS', meta_key) == 1
  local index_exists = rcall('EXISTS', seqbucket_key) == 1
  if index_exists and not meta_exists then
    return {ERR_META_LOST}
  end
  if meta_exists and not index_exists then
    local trim, err = meta_seq(meta_key, 'user_trim_seq')
    if err then return err end
    local fields = rcall('HGETALL', meta_key)
    for i = 1, #fields, 2 do
      local day = string.match(fields[i], '^bucket_expires_at:(%d+)$')
      if day and (tonumber(fields[i + 1]) or 0) > now then
        local max_seq = rcall('HGET', meta_key, 'bucket_max_seq:' .. day)
        if is_seq(max_seq) and pad(max_seq) >= pad(trim) then
          return {ERR_INDEX_LOST}
        end
      end
    end
  end
  return nil
end

-- Recomputes min_day / max_day / active_day_count from the day set (<= 31 members).
local function recompute_range(meta_key, days_key)
  local days = rcall('ZRANGE', days_key, 0, -1)
  local low, high = nil, nil
  for _, d in ipairs(days) do
    local n = tonumber(d)
    if low == nil or n < low then low = n end
    if high == nil or n > high then high = n end
  end
  rcall('HSET', meta_key, 'active_day_count', tostring(#days))
  if low == nil then
    rcall('HDEL', meta_key, 'min_day', 'max_day')
  else
    rcall('HSET', meta_key, 'min_day', string.format('%d', low), 'max_day', string.format('%d', high))
  end
end

-- SPEC 4.4 steps 4 and 5: nil when `after` (plain decimal) may still be served.
local function check_cursor(meta_key, after, after_plus_one)
  local trim, err = meta_seq(meta_key, 'user_trim_seq')
  if err then return err end
  if pad(after_plus_one) < pad(trim) then
    return {ERR_CURSOR_TRIMMED, trim}
  end
  local boundary
  boundary, err = meta_seq(meta_key, 'expired_gap_boundary')
  if err then return err end
  if pad(after) < pad(boundary) then
    return {ERR_CURSOR_GAP, boundary}
  end
  return nil
end
