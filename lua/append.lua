--[[
  Append one event group to a mailbox (SPEC 4.2, steps 2 to 8, in that order).

  The same script writes the live copy of a user or a repair's staging copy: KEYS[1..5] name
  one copy (live `P:epoch:{user}` ... or staging `P:stgepoch:{user}` ..., see
  src/store/redis/keys.rs) and ARGV[10] says which (see `fence_gate`).

  KEYS[1]  P:epoch:{user}                 current epoch of the user
  KEYS[2]  P:mbmeta:{user}:<epoch>        V4 meta hash
  KEYS[3]  P:mbseqbucket:{user}:<epoch>   identity index: member seq16, score expires_at(day)
  KEYS[4]  P:mbdays:{user}:<epoch>        day set: member day, score expires_at(day)
  KEYS[5]  P:mbday:{user}:<epoch>:        prefix of the day bucket keys (a day is appended)
  KEYS[6]  P:repair:{user}                repair fence: the holder id of the repair of the user

  ARGV[1]  key stem of the copy, `P:` or `P:stg` (names another epoch's keys)
  ARGV[2]  hash tag {user}
  ARGV[3]  epoch                          ARGV[4]  mailbox_seq, plain decimal
  ARGV[5]  day                            ARGV[6]  expires_at(day)
  ARGV[7]  future_window_days             ARGV[8]  max_active_span_days
  ARGV[9]  retention_days                 ARGV[10] '' (live write) or the repair's holder id
  ARGV[11] '1' when the caller follows with WAIT (see `propagate_for_wait`), else '0'
  ARGV[12..] the group's bucket members, sorted by ordinal:
             seq16 '|' ordinal10 '|' created_at '|' canonical payload

  Returns {code, ...}:
    1 inserted, 2 unchanged, 3 replaced, 4 expired_merged, 5 trimmed, 6 stale_epoch
    ERR_FUTURE, ERR_SPAN low high, ERR_CROSS_DAY existing_day, ERR_UNSUPPORTED_FORMAT found,
    ERR_INDEX_LOST, ERR_META_LOST, ERR_IDENTITY_MISSING seqbucket_max_seq, ERR_BAD_PROOF detail,
    ERR_UNDER_REPAIR holder (live write, a fence exists), ERR_FENCE_LOST (staged write, the
    fence is not this repair's)

  Nothing is written before the outcome is known: a rejected input for a cold user leaves no key,
  and every error leaves the mailbox byte-identical.
]]
local epoch_key, meta_key, seqbucket_key, days_key, day_prefix =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local stem, tag = ARGV[1], ARGV[2]
local epoch = tonumber(ARGV[3])
local seq = ARGV[4]
local seq16 = member16(seq)
local day = tonumber(ARGV[5])
local expires_at = tonumber(ARGV[6])
local future_window, span_days, retention_days = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local members = {}
for i = 12, #ARGV do members[#members + 1] = ARGV[i] end
local day_key = day_prefix .. ARGV[5]

local function append()
  local fenced = fence_gate(KEYS[6], ARGV[10])
  if fenced then return fenced end

  local now = now_seconds()

  -- 2. Future window, before anything is read or written.
  if day > math.floor(now / 86400) + future_window then
    return {ERR_FUTURE}
  end

  -- 3. Epoch. A move is applied only once something is written.
  local current = rcall('GET', epoch_key)
  local move_from = nil
  if current then
    current = tonumber(current)
    if epoch < current then return {6} end
    if epoch > current then move_from = current end
  end
  local function establish_epoch()
    if move_from then delete_epoch(epoch_keys(stem, tag, move_from)) end
    if move_from or not current then rcall('SET', epoch_key, ARGV[3]) end
  end

  -- 4. Format.
  -- 4-6. Format, promote, identity hygiene, integrity.
  local err = prepare_write(meta_key, days_key, seqbucket_key, now)
  if err then return err end

  -- 7. Trim.
  local trim
  trim, err = meta_seq(meta_key, 'user_trim_seq')
  if err then return err end
  if pad(seq) < pad(trim) then return {5} end

  -- 8. Identity lookup.
  local existing = rcall('ZSCORE', seqbucket_key, seq16)
  if existing then
    existing = tonumber(existing)
    if existing ~= expires_at then
      local existing_day = math.floor(existing / 86400) - 1 - retention_days
      return {ERR_CROSS_DAY, string.format('%d', existing_day)}
    end
    -- Same day: compare the whole stored group with the incoming one.
    local score = tonumber(seq)
    local stored = rcall('ZRANGE', day_key, score, score, 'BYSCORE')
    local old = {}
    for _, m in ipairs(stored) do
      if string.sub(m, 1, 17) == seq16 .. '|' then old[#old + 1] = m end
    end
    local same = #old == #members
    if same then
      for i = 1, #old do
        if old[i] ~= members[i] then same = false break end
      end
    end
    if same then return {2} end
    zrem_all(day_key, old)
    zadd_all(day_key, score, members)
    rcall('EXPIREAT', day_key, expires_at)
    return {3}
  end

  if expires_at <= now then
    -- Expired replay: no events, no identity; only the gap boundary moves.
    establish_epoch()
    ensure_meta(meta_key)
    local boundary
    boundary, err = meta_seq(meta_key, 'expired_gap_boundary')
    if err then return err end
    rcall('HSET', meta_key, 'expired_gap_boundary', seq_max(boundary, seq))
    return {4}
  end

  local seqbucket_max
  seqbucket_max, err = meta_seq(meta_key, 'seqbucket_max_seq')
  if err then return err end
  if pad(seq) <= pad(seqbucket_max) then
    return {ERR_IDENTITY_MISSING, seqbucket_max}
  end

  local low, high = day, day
  for _, d in ipairs(rcall('ZRANGE', days_key, 0, -1)) do
    local n = tonumber(d)
    if n < low then low = n end
    if n > high then high = n end
  end
  if high - low > span_days then
    return {ERR_SPAN, string.format('%d', low), string.format('%d', high)}
  end

  -- Insert: events, identity (with its TTL never below the largest live expiry), day member,
  -- proofs, range, seqbucket_max_seq.
  establish_epoch()
  ensure_meta(meta_key)
  local score = tonumber(seq)
  zadd_all(day_key, score, members)
  rcall('EXPIREAT', day_key, expires_at)
  rcall('ZADD', seqbucket_key, expires_at, seq16)
  if rcall('TTL', seqbucket_key) == -1 then
    -- A new key, or one that lost its TTL: set it from the largest score (GT does nothing on a key
    -- without TTL, which Redis treats as infinite).
    local top = rcall('ZRANGE', seqbucket_key, 0, 0, 'REV', 'WITHSCORES')
    rcall('EXPIREAT', seqbucket_key, top[2])
  else
    rcall('EXPIREAT', seqbucket_key, expires_at, 'GT')
  end
  rcall('ZADD', days_key, expires_at, ARGV[5])
  local proof_max = rcall('HGET', meta_key, 'bucket_max_seq:' .. ARGV[5])
  if not is_seq(proof_max) then proof_max = seq else proof_max = seq_max(proof_max, seq) end
  rcall('HSET', meta_key,
    'bucket_max_seq:' .. ARGV[5], proof_max,
    'bucket_expires_at:' .. ARGV[5], ARGV[6],
    'seqbucket_max_seq', seq_max(seqbucket_max, seq))
  recompute_range(meta_key, days_key)
  return {1}
end

local reply = append()
if ARGV[11] == '1' then propagate_for_wait(epoch_key) end
return reply
