--[[
  The V4 meta of one mailbox, read into a table that every later step reads and updates, and the
  checks written against it: format (SPEC 4.2.4), integrity (4.2.6) and cursor (4.4 steps 4, 5).

  One HMGET reads what every path decides with (`load_meta`); the range fields and the gap
  boundary are read by the few paths that need them (`load_range`, `load_boundary`): every field
  a script reads costs a conversion of the reply into Lua, on every call.

  Besides the SPEC 5 fields the meta keeps `next_expires_at`: the smallest `bucket_expires_at`
  of the active days (absent when there is none, or when an older writer did not keep it). Until
  that second nothing can have expired, so promote needs no read of the day set (SPEC 4.5 runs
  before every append and scan; this keeps it O(1) on the common path).
]]

-- Reads the format version, user_trim_seq, seqbucket_max_seq and next_expires_at, and the fields
-- `asked` names by their role, in one call: `boundary` (the gap boundary: promote and scans) or
-- `proof` (a day's proof: append), and with `proof` also `seq_position` (the seq's source
-- position) and `mailbox_position` (the mailbox-level position an older release kept). An empty
-- `asked` (truncate) reads the four. Returns a table with those fields under their roles (false
-- when absent; `boundary` as stored text) and `exists`.
local function load_meta(meta_key, asked)
  local r
  if asked.proof then
    r = redis.call('HMGET', meta_key, 'retention_format_version', 'user_trim_seq',
      'seqbucket_max_seq', 'next_expires_at', asked.proof, asked.seq_position,
      asked.mailbox_position)
  else
    r = redis.call('HMGET', meta_key, 'retention_format_version', 'user_trim_seq',
      'seqbucket_max_seq', 'next_expires_at', asked.boundary or '')
  end
  local m = {key = meta_key, version = r[1], trim = r[2], seqbucket_max = r[3],
    next_expiry = r[4]}
  if asked.proof then
    m.proof, m.seq_position, m.mailbox_position = r[5], r[6], r[7]
  else
    m.boundary_text = r[5]
  end
  m.exists = r[1] or r[2] or r[3] or r[4] or r[5]
  if not m.exists then
    -- Only a meta none of whose read fields is set reaches here: a cold user, or damage.
    m.exists = redis.call('EXISTS', meta_key) == 1
  end
  return m
end

--[[
  Source positions (SPEC 7.2, zombie fencing): the meta field `pos:<seq>` (canonical seq) holds
  `partition:offset@log`, the log position the seq's stored version was written from, followed
  by `|i<token>` or `|r<token>` when the write had a token (the answer a retry of that very
  write gets, src/model/written.rs). It lives
  and dies with that version: written by the insert or replace that wrote it, deleted by a
  replace without a position, by promote with the seq's expired identity, by truncate with the
  trimmed identity, and with the whole meta by an epoch move. So the meta holds at most one
  position per live identity (SPEC 4.6). The rule that reads it is `model::rules::superseded`.
]]

-- The meta field of a seq's position; `seq` canonical or a 16-digit identity member.
local function position_field(seq)
  local canonical = string.match(seq, '^0*(%d-)$')
  if canonical == nil or canonical == '' then canonical = '0' end
  return 'pos:' .. canonical
end

-- Deletes the positions of identity members `members` (16 digits), in calls of at most 1,000
-- fields (see `zadd_argv`).
local function drop_positions(meta_key, members)
  for i = 1, #members, 1000 do
    local fields = {}
    for j = i, math.min(i + 999, #members) do fields[#fields + 1] = position_field(members[j]) end
    redis.call('HDEL', meta_key, unpack(fields))
  end
end

-- Reads active_day_count, min_day and max_day into `m` (once).
local function load_range(m)
  if m.range_loaded then return end
  local r = redis.call('HMGET', m.key, 'active_day_count', 'min_day', 'max_day')
  m.day_count, m.min_day, m.max_day, m.range_loaded = r[1], r[2], r[3], true
end

--[[
  SPEC 7.3, any one piece of a mailbox lost: the epoch key, the meta, the identity index, the day
  set and the day buckets are written together, so a piece found without the others was lost (a
  stray DEL, an eviction, a partial restore), and writing or reading on would serve the rest as
  if whole. The invariants are what the meta already knows, checked where the script reads the
  piece anyway or on a rare path: the epoch key and its epoch's meta exist together
  (`epoch_lost`), and the day set holds exactly the meta's `active_day_count` days
  (`day_set_lost`: one ZCARD on the first write of a day, none on the common path).
]]

-- The epoch key `current` (false when missing) against the epoch `wanted` of a call whose meta
-- is `m`: the error reply when the key was lost (the meta of its epoch exists) or went
-- backwards (it names an older epoch than one that has a mailbox: lost, then written again by a
-- stale record). nil otherwise.
local function epoch_lost(current, wanted, m)
  if not m.exists then return nil end
  if not current then
    return {-14 --[[bad_proof]], 'the epoch key is missing although epoch ' .. wanted ..
      ' has a mailbox (evicted, deleted or not restored)'}
  end
  if current ~= wanted and seq_less(current, wanted) then
    return {-14 --[[bad_proof]], 'the epoch key says ' .. current .. ' although epoch ' ..
      wanted .. ' has a mailbox (the key was lost and written again by an older epoch)'}
  end
  return nil
end

-- The day set's size against the meta's `active_day_count` (`m` with its range loaded): the
-- error reply when they disagree. `held` is the set's size when the caller has read the set
-- already (a scan), else it is asked (ZCARD), once per `m`.
local function day_set_lost(m, days_key, held)
  if not m.exists or (m.days_checked and not held) then return nil end
  m.days_checked = true
  local counted = tonumber(m.day_count) or 0
  held = held or redis.call('ZCARD', days_key)
  if held ~= counted then
    return {-14 --[[bad_proof]], 'the day set holds ' .. held .. ' day(s) although the meta ' ..
      'counts ' .. counted .. ' (evicted, deleted or not restored)'}
  end
  return nil
end

-- A seq field value ('0' when absent); nil, err when it is not a canonical decimal seq.
local function seq_value(v, field)
  if v == false or v == nil then return '0', nil end
  if type(v) ~= 'string' or not (v == '0' or (#v <= 16 and string.match(v, '^[1-9]%d*$'))) then
    return nil, {-14 --[[bad_proof]], 'meta field ' .. field .. ' is not a seq: ' .. tostring(v)}
  end
  return v, nil
end

-- Reads and validates expired_gap_boundary into `m.boundary` (once); the error reply on damage.
local function load_boundary(m)
  if m.boundary then return nil end
  local err
  m.boundary, err = seq_value(redis.call('HGET', m.key, 'expired_gap_boundary'),
    'expired_gap_boundary')
  return err
end

-- SPEC 4.2.4: nil when the meta is absent or V4, else the error reply.
local function check_format(m)
  if m.exists and m.version ~= '4' then
    return {-10 --[[unsupported_format]], m.version or ''}
  end
  return nil
end

-- The seq fields every write and scan decides with (user_trim_seq, seqbucket_max_seq),
-- validated in place; the error reply on damage.
local function meta_seqs(m)
  local err
  m.trim, err = seq_value(m.trim, 'user_trim_seq')
  if err then return err end
  m.seqbucket_max, err = seq_value(m.seqbucket_max, 'seqbucket_max_seq')
  return err
end

-- The fields a brand-new V4 meta starts with (HSET arguments); callers append the fields they
-- set (a later duplicate of a field wins in HSET, e.g. the gap boundary or the day count).
local function new_meta_fields()
  return {'retention_format_version', '4', 'expired_gap_boundary', '0',
    'user_trim_seq', '0', 'seqbucket_max_seq', '0', 'active_day_count', '0'}
end

-- Creates a V4 meta if the mailbox has none (m is updated to match).
local function ensure_meta(m)
  if not m.exists then
    redis.call('HSET', m.key, unpack(new_meta_fields()))
    m.exists, m.version, m.boundary = true, '4', '0'
    m.day_count, m.min_day, m.max_day, m.range_loaded = '0', false, false, true
  end
end

-- The identity index's absolute expiry in seconds (EXPIRETIME), repairing a key without one to
-- its largest score (never to now + N). Returns -2 when the index does not exist.
local function identity_expiry(seqbucket_key)
  local expiry = redis.call('EXPIRETIME', seqbucket_key)
  if expiry == -1 then
    local top = redis.call('ZRANGE', seqbucket_key, 0, 0, 'REV', 'WITHSCORES')
    expiry = tonumber(top[2])
    redis.call('EXPIREAT', seqbucket_key, top[2])
  end
  return expiry
end

-- The ERR_BAD_PROOF reply for a live day whose bucket is gone while its proof (`max_seq`)
-- covers groups there: the one text of the scan's and the append's check.
local function lost_bucket(day, max_seq)
  return {-14 --[[bad_proof]], 'day ' .. day .. ': its bucket is missing although the meta ' ..
    'proves groups up to seq ' .. max_seq .. ' there (evicted, deleted or not restored)'}
end

-- The first day whose proofs in the meta say it holds live groups (not expired at `now`, a seq
-- at or above the trim), with that seq, or nil: read with one HGETALL, for the rare paths that
-- must know whether the meta proves anything (an index or a day set that is not there).
local function live_proof(m, now)
  local fields = redis.call('HGETALL', m.key)
  local proofs = {}
  for i = 1, #fields, 2 do proofs[fields[i]] = fields[i + 1] end
  for field, value in pairs(proofs) do
    local day = string.match(field, '^bucket_expires_at:(%d+)$')
    if day and (tonumber(value) or 0) > tonumber(now) then
      local max_seq = proofs['bucket_max_seq:' .. day]
      if is_seq(max_seq) and not seq_less(max_seq, m.trim) then return day, max_seq end
    end
  end
  return nil
end

-- SPEC 4.4 step 7 (amended): nil when every live day of `days` (the day set after promote) still
-- has its bucket, else the ERR_BAD_PROOF reply naming the first that lost it. A day whose bucket
-- is gone while its proof covers a seq at or above the trim lost its groups (an evicting Redis, a
-- stray DEL, a partial restore); a day wholly below the trim may be empty (truncate removed its
-- members, and Redis deletes an empty sorted set). One EXISTS of the days asked about.
local function check_buckets_present(m, day_prefix, days)
  if #days == 0 then return nil end
  local keys = {}
  for i, day in ipairs(days) do keys[i] = day_prefix .. day end
  if redis.call('EXISTS', unpack(keys)) == #keys then return nil end
  for i, day in ipairs(days) do
    if redis.call('EXISTS', keys[i]) == 0 then
      local proof = redis.call('HGET', m.key, 'bucket_max_seq:' .. day)
      if is_seq(proof) and not seq_less(proof, m.trim) then return lost_bucket(day, proof) end
    end
  end
  return nil
end

-- SPEC 4.2.6: nil when the meta and the identity index agree, else the error reply. `now` is
-- the TIME second as text.
local function check_integrity(m, index_exists, now)
  if index_exists and not m.exists then
    return {-12 --[[meta_lost]]}
  end
  if m.exists and not index_exists then
    -- Rare (a mailbox whose every identity expired or was trimmed, or damage): read the proofs.
    if live_proof(m, now) then return {-11 --[[index_lost]]} end
  end
  return nil
end

-- SPEC 4.4 steps 4 and 5: nil when `after` (canonical decimal) may still be served. Needs the
-- gap boundary loaded.
local function check_cursor(m, after, after_plus_one)
  if seq_less(after_plus_one, m.trim) then
    return {-30 --[[cursor_trimmed]], m.trim}
  end
  if seq_less(after, m.boundary) then
    return {-31 --[[cursor_gap]], m.boundary}
  end
  return nil
end
