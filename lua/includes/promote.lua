--[[
  Promote (SPEC 4.5), in two phases so a corrupt entry anywhere changes nothing.

  Nothing can have expired before the meta's `next_expires_at` (the smallest score of the day
  set): then promote reads nothing more and writes nothing. Otherwise (or when the meta does not
  know that second) phase 1 reads every expired day of the day set, validates its member, its
  score and both proof fields, and computes the new gap boundary; any damage returns
  {ERR_BAD_PROOF, detail} before a single write. Phase 2 applies everything: the boundary, the
  deleted proofs and day members, the identity hygiene (expired identity members go, with their
  seqs' source positions; this is the only place they are removed, and no identity can expire before its day does), and the range,
  count and first expiry of what remains.

  `m` is the mailbox's meta (meta.lua), its seq fields validated; it is updated in place. `now`
  is the TIME second as text (canonical decimal).

  promote(m, days_key, seqbucket_key, now) -> expired_day_count, nil | nil, error reply
]]
local function promote(m, days_key, seqbucket_key, now)
  if not m.exists then return 0, nil end
  local next_expiry = m.next_expiry
  if next_expiry and string.match(next_expiry, '^[1-9]%d*$') and seq_less(now, next_expiry) then
    return 0, nil
  end

  -- Phase 1: validate and plan. The day set first holds what the meta counts (SPEC 7.3): a lost
  -- set would otherwise be "repaired" into an empty range below, hiding the loss for good.
  load_range(m)
  local lost_days = day_set_lost(m, days_key)
  if lost_days then return nil, lost_days end
  local expired = redis.call('ZRANGE', days_key, '-inf', now, 'BYSCORE', 'WITHSCORES')
  local boundary = nil
  local expired_days = {}
  for i = 1, #expired, 2 do
    local day, score = expired[i], expired[i + 1]
    if not string.match(day, '^%d+$') then
      return nil, {-14 --[[bad_proof]], 'day set member ' .. day .. ' is not a day'}
    end
    local proof = redis.call('HMGET', m.key, 'bucket_max_seq:' .. day, 'bucket_expires_at:' .. day)
    local max_seq, expires_at = proof[1], proof[2]
    if not is_seq(max_seq) then
      return nil, {-14 --[[bad_proof]],
        'expired day ' .. day .. ': bucket_max_seq is missing or not a seq'}
    end
    if not expires_at or not string.match(expires_at, '^%d+$') then
      return nil, {-14 --[[bad_proof]],
        'expired day ' .. day .. ': bucket_expires_at is missing or not a number'}
    end
    if tonumber(expires_at) ~= tonumber(score) then
      return nil, {-14 --[[bad_proof]], 'expired day ' .. day .. ': bucket_expires_at ' ..
        expires_at .. ' disagrees with the day set score ' .. score}
    end
    if boundary == nil then
      local err = load_boundary(m)
      if err then return nil, err end
      boundary = m.boundary
    end
    -- A day wholly below the trim proves no gap: its seqs were removed explicitly.
    if not seq_less(max_seq, m.trim) then
      boundary = seq_max(boundary, max_seq)
    end
    expired_days[#expired_days + 1] = day
  end

  -- Phase 2: apply.
  local fields = {}
  if #expired_days > 0 then
    local proofs = {}
    for _, day in ipairs(expired_days) do
      proofs[#proofs + 1] = 'bucket_max_seq:' .. day
      proofs[#proofs + 1] = 'bucket_expires_at:' .. day
    end
    redis.call('HDEL', m.key, unpack(proofs))
    redis.call('ZREM', days_key, unpack(expired_days))
    -- The expired identities go, and the source positions of their seqs with them.
    local gone = redis.call('ZRANGE', seqbucket_key, '-inf', now, 'BYSCORE')
    if #gone > 0 then
      redis.call('ZREMRANGEBYSCORE', seqbucket_key, '-inf', now)
      drop_positions(m.key, gone)
    end
    m.boundary = boundary
    fields = {'expired_gap_boundary', boundary}
  end
  -- What remains (<= 31 days): its range, count and first expiry.
  local remaining = redis.call('ZRANGE', days_key, 0, -1, 'WITHSCORES')
  local low, high, first = nil, nil, nil
  for i = 1, #remaining, 2 do
    local d, score = tonumber(remaining[i]), tonumber(remaining[i + 1])
    if d then
      if low == nil or d < low then low = d end
      if high == nil or d > high then high = d end
    end
    if first == nil or score < first then first = score end
  end
  load_range(m)
  local function set(name, field, value)
    if m[name] ~= value then
      m[name] = value
      fields[#fields + 1] = field
      fields[#fields + 1] = value
    end
  end
  set('day_count', 'active_day_count', string.format('%d', #remaining / 2))
  if low then
    set('min_day', 'min_day', string.format('%d', low))
    set('max_day', 'max_day', string.format('%d', high))
    set('next_expiry', 'next_expires_at', string.format('%d', first))
  end
  if #fields > 0 then redis.call('HSET', m.key, unpack(fields)) end
  if not low and (m.min_day or m.max_day or m.next_expiry) then
    m.min_day, m.max_day, m.next_expiry = false, false, false
    redis.call('HDEL', m.key, 'min_day', 'max_day', 'next_expires_at')
  end
  return #expired_days, nil
end

--[[
  The checks every write starts with (SPEC 4.2 steps 4 and 5): format, the seq fields, promote
  with its identity hygiene. The integrity check (step 6) follows in the caller, which knows
  whether the identity index exists (an identity found proves it without another read).
  Returns nil and the number of expired days promote compacted, or the error reply to return
  as it is.
]]
local function prepare_write(m, days_key, seqbucket_key, now)
  local err = check_format(m)
  if err then return err, 0 end
  err = meta_seqs(m)
  if err then return err, 0 end
  local promoted, perr = promote(m, days_key, seqbucket_key, now)
  return perr, promoted or 0
end

--[[
  A refusal of a write after its promote compacted days: those changes are applied (a script
  does not roll back), so the caller must still count them (`store::PromotedBuckets`). Returns
  `reply` as it is when nothing was compacted, else {7, promoted, reply...}; 7 is no outcome
  and no error code of any script.
]]
local function after_promote(reply, promoted)
  if promoted == 0 then return reply end
  local wrapped = {7, promoted}
  for _, v in ipairs(reply) do wrapped[#wrapped + 1] = v end
  return wrapped
end
