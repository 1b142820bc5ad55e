--[[
  Promote (SPEC 4.5), in two phases so a corrupt entry anywhere changes nothing.

  Phase 1 reads every expired day of the day set, validates its member, its score and both proof
  fields, and computes the new gap boundary; any damage returns {ERR_BAD_PROOF, detail} before a
  single write. Phase 2 applies everything: the boundary, the deleted proofs and day members, the
  recomputed range, and the identity hygiene.

  promote(meta_key, days_key, seqbucket_key, now) -> expired_day_count, nil | nil, error reply
]]
local function promote(meta_key, days_key, seqbucket_key, now)
  local trim, err = meta_seq(meta_key, 'user_trim_seq')
  if err then return nil, err end
  local boundary
  boundary, err = meta_seq(meta_key, 'expired_gap_boundary')
  if err then return nil, err end

  -- Phase 1: validate and plan.
  local expired = rcall('ZRANGE', days_key, '-inf', now, 'BYSCORE', 'WITHSCORES')
  local expired_days = {}
  for i = 1, #expired, 2 do
    local day, score = expired[i], expired[i + 1]
    if not string.match(day, '^%d+$') then
      return nil, {ERR_BAD_PROOF, 'day set member ' .. day .. ' is not a day'}
    end
    local proof = rcall('HMGET', meta_key, 'bucket_max_seq:' .. day, 'bucket_expires_at:' .. day)
    local max_seq, expires_at = proof[1], proof[2]
    if not is_seq(max_seq) then
      return nil, {ERR_BAD_PROOF, 'expired day ' .. day .. ': bucket_max_seq is missing or not a seq'}
    end
    if not expires_at or not string.match(expires_at, '^%d+$') then
      return nil, {ERR_BAD_PROOF, 'expired day ' .. day .. ': bucket_expires_at is missing or not a number'}
    end
    if tonumber(expires_at) ~= tonumber(score) then
      return nil, {ERR_BAD_PROOF, 'expired day ' .. day .. ': bucket_expires_at ' .. expires_at ..
        ' disagrees with the day set score ' .. score}
    end
    -- A day wholly below the trim proves no gap: its seqs were removed explicitly.
    if pad(max_seq) >= pad(trim) then
      boundary = seq_max(boundary, max_seq)
    end
    expired_days[#expired_days + 1] = day
  end

  -- Phase 2: apply.
  if #expired_days > 0 then
    for _, day in ipairs(expired_days) do
      rcall('HDEL', meta_key, 'bucket_max_seq:' .. day, 'bucket_expires_at:' .. day)
      rcall('ZREM', days_key, day)
    end
    rcall('HSET', meta_key, 'expired_gap_boundary', boundary)
    recompute_range(meta_key, days_key)
  end
  identity_hygiene(seqbucket_key, now)
  return #expired_days, nil
end

--[[
  The checks every write starts with (SPEC 4.2 steps 4 to 6): format, promote when the meta
  exists, identity hygiene, integrity. Returns nil, or the error reply to return as it is.
]]
local function prepare_write(meta_key, days_key, seqbucket_key, now)
  local err = check_format(meta_key)
  if err then return err end
  if rcall('EXISTS', meta_key) == 1 then
    local _, perr = promote(meta_key, days_key, seqbucket_key, now)
    if perr then return perr end
  end
  identity_hygiene(seqbucket_key, now)
  return check_integrity(meta_key, seqbucket_key, now)
end
