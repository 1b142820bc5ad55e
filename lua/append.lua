--[[
  Append one event group to a mailbox (SPEC 4.2, steps 2 to 8, in that order).

  The same script writes the live copy of a user or a repair's staging copy: KEYS[1..5] name
  one copy (live `P:epoch:{user}` ... or staging `P:stgepoch:{user}` ..., see
  src/store/redis/keys.rs) and ARGV[11] says which (see `fence_verdict`).

  KEYS[1]  P:epoch:{user}                 current epoch of the user
  KEYS[2]  P:mbmeta:{user}:<epoch>        V4 meta hash
  KEYS[3]  P:mbseqbucket:{user}:<epoch>   identity index: member seq16, score expires_at(day)
  KEYS[4]  P:mbdays:{user}:<epoch>        day set: member day, score expires_at(day)
  KEYS[5]  P:mbday:{user}:<epoch>:        prefix of the day bucket keys (a day is appended)
  KEYS[6]  P:repair:{user}                repair fence: the holder id of the repair of the user
  KEYS[7]  P:store:{slot tag}             the slot's store marker when it is known to hold data,
                                          else KEYS[6] again (see `store_lost` in common.lua)

  ARGV[1]  key stem of the copy, `P:` or `P:stg` (names another epoch's keys)
  ARGV[2]  hash tag {user}                ARGV[3]  epoch
  ARGV[4]  mailbox_seq, canonical decimal ARGV[5]  the same seq, 16 digits zero-padded
  ARGV[6]  day                            ARGV[7]  expires_at(day)
  ARGV[8]  (day - future_window_days) * 86400, at least 0: the first second the day is inside
           the future window              ARGV[9]  max_active_span_days
  ARGV[10] retention_days                 ARGV[11] '' (live write) or the repair's holder id
  ARGV[12] '1' when the caller follows with WAIT (see `propagate_for_wait`), else '0'
  ARGV[13] the number of members plus one (bounds the read of a same-day replay)
  ARGV[14] the group's place in the dispatch log, `partition:offset@log`, or '' (zombie fencing)
  ARGV[15] the delivery's write token, 16 hex digits, or '' (model/written.rs)
  ARGV[16..] the group's bucket members, sorted by ordinal:
             seq16 '|' ordinal10 '|' created_at '|' canonical payload
  Numbers travel as the caller's decimal strings (see common.lua).

  Returns {code, ...}:
    1 inserted, 2 unchanged, 3 replaced, 4 expired_merged, 5 trimmed, 8 superseded (each
    followed by the number of expired days promote compacted on the way; superseded then by the
    stored version's position), 6 stale_epoch,
    7 promoted refusal...: one of the refusals below after promote compacted days
    (`after_promote`)
    ERR_FUTURE day now, ERR_SPAN low high day, ERR_CROSS_DAY existing_day, ERR_UNSUPPORTED_FORMAT found,
    ERR_INDEX_LOST, ERR_META_LOST, ERR_IDENTITY_MISSING seqbucket_max_seq, ERR_BAD_PROOF detail,
    ERR_UNDER_REPAIR holder (live write, a fence exists), ERR_FENCE_LOST (staged write, the
    fence is not this repair's), ERR_STORE_LOST marker (live write, the slot's data is gone)

  Zombie fencing (SPEC 7.2): the meta field `pos:<seq>` keeps the log position the seq's stored
  version was written from (meta.lua). A same-day replace of the seq from an older offset of the
  same log and partition was decided under an assignment that has moved on, or replays a record
  the log has since superseded: it changes nothing and answers superseded
  (`model::rules::superseded` is the rule). Read in the meta's one HMGET; written in the HSET an
  insert makes anyway, and by one HSET (or HDEL) on a replace. The mailbox-level
  `source_position` an older release kept is read in the same HMGET and deleted by the next
  write that changes the mailbox: nothing decides with it.

  A lost answer keeps its outcome (src/model/written.rs): a write with a token stores
  `position|i<token>` (insert) or `position|r<token>` (replace) in `pos:<seq>`; an identical
  same-day write that brings the token stored there is a retry of the very write that made the
  version (its answer was lost) and answers as that write did (`model::rules::identical_answer`);
  any other identical write is unchanged. The suffix is never part of the position compared.

  Within a run (`append_run.lua`) the groups share `known`: what this script call has already
  read or written of the mailbox, so each is read once per run, not once per group: the fence
  and epoch, the second (a run is decided at one instant, as memory decides it under one lock),
  the meta fields `load_meta` reads, the identity index's expiry and the expiry set on each day
  bucket. Every entry equals what the server holds: each write through this body updates it,
  and a promote that did more than look (it may rewrite the meta and empty the index) drops the
  meta and index entries. `known` is defined by the script around this body: a run's table
  (`{bucket_expiry = {}}`), or false alone, where the body reads and writes as if it did not
  exist: a single append (the steady state) builds no table it would not use.

  Nothing is written before the outcome is known: a rejected input for a cold user leaves no key,
  and an error leaves the mailbox as it was (apart from what promote compacted, which any
  operation would have compacted the same way).

  Cost on the common paths (commands per call): an identical replay MGET of fence and epoch,
  TIME, one HMGET of the meta, ZSCORE, EXPIRETIME of the identity index (a TTL-less index is
  repaired), and one ZRANGE bounded by the incoming group's size; a
  warm insert (a day already active) the same up to ZSCORE, then EXPIRETIME of the identity
  index, EXPIREAT + ZADD of the bucket (the EXPIREAT first: its answer says the bucket of an active
  day still exists), ZADD of the identity and one HSET of the meta (a new day
  adds one HMGET of the range, ZADD of the day set and EXPIREAT of the index). Promote reads the
  day set only once its first expiry has passed (`next_expires_at`).
]]
local epoch_key, meta_key, seqbucket_key, days_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local seq, seq16, day_text, expires_text = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local day_key = KEYS[5] .. day_text
local members_from = 16
local incoming_position = ARGV[14]
local incoming_token = ARGV[15]

local position_key = position_field(seq)

-- `partition`, `offset`, `log` of a stored `partition:offset@log[|mark]` position (nils for
-- anything else: an older release's bare `partition:offset` names no log and fences nothing).
-- A log never holds `|` (model::LogId), so the mark after it is never part of the position.
local function position_parts(position)
  return string.match(position or '', '^(%-?%d+):(%d+)@([^|]+)')
end

-- What `pos:<seq>` holds for a version this write makes: its position, with the write's mark
-- (`i` inserted, `r` replaced) and token when it has one; '' for a write without a position.
local function stored_position(mark)
  if incoming_position == '' or incoming_token == '' then return incoming_position end
  return incoming_position .. '|' .. mark .. incoming_token
end

-- `model::rules::identical_answer`: unchanged (2), unless the stored version was written by
-- this very delivery (its token), whose answer was lost: then what that write answered.
local function identical_answer(held)
  if incoming_token ~= '' and held then
    local mark = string.match(held, '|([ir])' .. incoming_token .. '$')
    if mark == 'i' then return 1 elseif mark == 'r' then return 3 end
  end
  return 2
end

-- `model::rules::superseded`: the seq's stored version came from a later offset of the same log
-- and partition than the incoming write.
local function superseded(held, incoming)
  local hp, ho, hl = position_parts(held)
  local ip, io, il = position_parts(incoming)
  return hp ~= nil and hp == ip and hl == il and seq_less(io, ho)
end

-- `identity_expiry`, read once per run: `known` is the run's table, or false (see above).
local function identity_expiry_known(seqbucket_key, known)
  local expiry = known and known.index_expiry
  if not expiry then
    expiry = identity_expiry(seqbucket_key)
    if known then known.index_expiry = expiry end
  end
  return expiry
end

-- HSET of meta fields (HSET arguments), kept in `held` too: the fields a run knows
-- (`known.meta`), or false.
local function hset_known(meta_key, fields, held)
  redis.call('HSET', meta_key, unpack(fields))
  if held then
    for i = 1, #fields, 2 do held[fields[i]] = fields[i + 1] end
    held.exists = true
  end
end

-- The fields a write of this seq removes from the meta: the seq's position when the write has
-- none (the new version has no position) and the older release's mailbox-level position.
local function stale_position_fields(m, incoming)
  local stale = {}
  if incoming == '' and m.seq_position then stale[#stale + 1] = position_key end
  if m.mailbox_position then stale[#stale + 1] = 'source_position' end
  return stale
end

-- HDEL of `fields`, kept in `held` too (see `hset_known`).
local function hdel_known(meta_key, fields, held)
  if #fields == 0 then return end
  redis.call('HDEL', meta_key, unpack(fields))
  if held then
    for _, field in ipairs(fields) do held[field] = false end
  end
end

-- The fence and the epoch in one read (once per run: nothing but this body writes them here).
local gate = known and known.gate
if not gate then
  gate = redis.call('MGET', KEYS[6], epoch_key, KEYS[7])
  if known then known.gate = gate end
end
-- A live write on a slot whose data is gone waits (a repair's staged write is the rebuild).
local lost = ARGV[11] == '' and store_lost(gate[3] ~= false)
if lost then return lost end
local fenced = fence_verdict(gate[1], ARGV[11])
if fenced then return fenced end
if ARGV[12] == '1' and not (known and known.propagated) then
  propagate_for_wait(epoch_key, gate[2])
  if known then known.propagated = true end
end

local now = known and known.now
if not now then
  now = now_text()
  if known then known.now = now end
end

-- 2. Future window, before anything is read or written: day > today + future_window_days
-- exactly when now < (day - future_window_days) * 86400, the second the caller sends.
if seq_less(now, ARGV[8]) then
  return {ERR_FUTURE, day_text, now}
end

-- 3. Epoch (canonical decimals). A move is applied only once something is written.
local current = gate[2]
local move_from = false
if current and not string.match(current, '^%d+$') then
  -- A damaged epoch key: no rule can read it. Damage to the mailbox, not a fault of the record:
  -- fail closed (corrupt) until a repair rebuilds the user (SPEC 7, error classes).
  return {ERR_BAD_PROOF, 'the epoch key holds ' .. current .. ', not an epoch'}
end
if current and current ~= ARGV[3] then
  if seq_less(ARGV[3], current) then return {6} end
  move_from = current
end

-- 4, 5. Format, promote with identity hygiene: one read of the meta (with this day's proof),
-- or none when this run already knows those fields.
local proof_field = 'bucket_max_seq:' .. day_text
local m
local fields_known = known and known.meta
if fields_known and fields_known[proof_field] ~= nil then
  -- The seq's position is nil (unknown) for a seq this run has not met: only a replace reads it.
  local held = fields_known[position_key]
  m = {key = meta_key, version = fields_known.retention_format_version,
    trim = fields_known.user_trim_seq, seqbucket_max = fields_known.seqbucket_max_seq,
    next_expiry = fields_known.next_expires_at, proof = fields_known[proof_field],
    seq_position = held, mailbox_position = fields_known.source_position,
    exists = fields_known.exists}
else
  m = load_meta(meta_key,
    {proof = proof_field, seq_position = position_key, mailbox_position = 'source_position'})
  if known then
    known.meta = {retention_format_version = m.version, user_trim_seq = m.trim,
      seqbucket_max_seq = m.seqbucket_max, next_expires_at = m.next_expiry,
      [proof_field] = m.proof, [position_key] = m.seq_position,
      source_position = m.mailbox_position, exists = m.exists}
  end
end

-- The epoch key and the meta of its epoch are written together and never apart: a user whose
-- current epoch has no meta lost it (an evicting Redis, a stray DEL), with whatever else went.
-- Writing on would start the mailbox afresh over the loss.
if current == ARGV[3] and not m.exists then return {ERR_META_LOST} end
-- SPEC 7.3: an epoch key lost (the meta of the record's epoch exists without it) or gone
-- backwards (a move into an epoch that already has a mailbox).
local lost = epoch_lost(current, ARGV[3], m)
if lost then return lost end

-- Promote only looks (and writes nothing) before the meta's first expiry; past it, it may
-- rewrite the meta and empty the index, which `known` then forgets.
if known and m.exists and not (m.next_expiry and string.match(m.next_expiry, '^[1-9]%d*$')
    and seq_less(now, m.next_expiry)) then
  known.meta, known.index_expiry = nil, nil
end
local err, promoted = prepare_write(m, days_key, seqbucket_key, now)
if err then return err end
local function refused(reply) return after_promote(reply, promoted) end

-- 6. Integrity. A live identity of this seq proves the index exists (the replay path needs
-- no more); otherwise the index's expiry tells, and an index without one is repaired on the way.
local existing = redis.call('ZSCORE', seqbucket_key, seq16)
local index_expiry = 0
if not existing then index_expiry = identity_expiry_known(seqbucket_key, known) end
err = check_integrity(m, existing or index_expiry ~= -2, now)
if err then return refused(err) end

-- 7. Trim.
if seq_less(seq, m.trim) then return {5, promoted} end

-- Below 2^53 a seq's score (a double) is its own; above, neighbouring seqs may share one and
-- the 16-digit member prefix tells them apart.
local exact_score = seq_less(seq, '9007199254740992')

-- 8. Identity lookup.
if existing then
  if existing ~= expires_text then
    local existing_day = math.floor(tonumber(existing) / 86400) - 1 - tonumber(ARGV[10])
    return refused({ERR_CROSS_DAY, string.format('%d', existing_day)})
  end
  -- A TTL-less identity index (SPEC 5) is repaired to its max score by every path that meets
  -- it, the identical replay included: one EXPIRETIME, and the repair only when it is -1.
  identity_expiry_known(seqbucket_key, known)
  -- Same day: compare the stored group with the incoming one, reading at most one member more
  -- than the incoming group has.
  local old
  if exact_score then
    old = redis.call('ZRANGE', day_key, seq, seq, 'BYSCORE', 'LIMIT', '0', ARGV[13])
  else
    old = {}
    for _, member in ipairs(redis.call('ZRANGE', day_key, seq, seq, 'BYSCORE')) do
      if string.sub(member, 1, 17) == seq16 .. '|' then old[#old + 1] = member end
    end
  end
  -- A live identity whose group is gone from its live day: the events were lost (an evicting
  -- Redis, a stray DEL, a partial restore). Damage, never `replaced` over it (SPEC 4.2 step 8).
  if #old == 0 then
    return refused({ERR_BAD_PROOF, 'day ' .. day_text .. ': the events of seq ' .. seq ..
      ' are missing from its live bucket although the identity index holds it (evicted, ' ..
      'deleted or not restored)'})
  end
  local same = #old == #ARGV - members_from + 1
  if same then
    for i = 1, #old do
      if old[i] ~= ARGV[members_from + i - 1] then
        same = false
        break
      end
    end
  end
  -- The seq's position decides a replace, and an identical write that brings a token.
  if m.seq_position == nil and (not same or incoming_token ~= '') then
    m.seq_position = redis.call('HGET', meta_key, position_key)
    if known and known.meta then known.meta[position_key] = m.seq_position end
  end
  if same then return {identical_answer(m.seq_position), promoted} end
  -- Different content from an older offset of the log and partition that wrote this version.
  if superseded(m.seq_position, incoming_position) then return {8, promoted, m.seq_position} end
  -- Different content: the whole old group goes, the new one comes, atomically.
  if exact_score then
    redis.call('ZREMRANGEBYSCORE', day_key, seq, seq)
  else
    zrem_all(day_key, old)
  end
  zadd_argv(day_key, seq, members_from, ARGV)
  redis.call('EXPIREAT', day_key, expires_text)
  if known then known.bucket_expiry[day_key] = expires_text end
  -- The new version's position replaces the old one's (or the old one goes).
  local replacing = stored_position('r')
  if replacing ~= '' and replacing ~= m.seq_position then
    hset_known(meta_key, {position_key, replacing}, known and known.meta)
  end
  hdel_known(meta_key, stale_position_fields(m, incoming_position), known and known.meta)
  return {3, promoted}
end

-- The epoch move and the epoch key, applied by the two paths that write.
local function establish_epoch()
  if move_from then delete_epoch(epoch_keys(ARGV[1], ARGV[2], move_from)) end
  if move_from or not current then
    redis.call('SET', epoch_key, ARGV[3])
    if known then known.gate = {gate[1], ARGV[3]} end
  end
end

if not seq_less(now, expires_text) then
  -- Expired replay: no events, no identity; only the gap boundary moves.
  err = load_boundary(m)
  if err then return refused(err) end
  establish_epoch()
  local fields = {}
  if not m.exists then fields = new_meta_fields() end
  fields[#fields + 1] = 'expired_gap_boundary'
  fields[#fields + 1] = seq_max(m.boundary, seq)
  hset_known(meta_key, fields, known and known.meta)
  return {4, promoted}
end

if not seq_less(m.seqbucket_max, seq) then
  return refused({ERR_IDENTITY_MISSING, m.seqbucket_max})
end

-- A day with a proof is active (in the day set, inside the range): adding to it cannot widen
-- the span. A new day is checked against the range kept in the meta.
local had_proof = is_seq(m.proof)
local low, high
if not had_proof and redis.call('EXISTS', day_key) == 1 then
  -- A day the meta knows nothing of has no bucket yet; one that exists is what is left of a
  -- mailbox whose meta (and epoch) were lost: writing into it would serve the leftovers as if
  -- whole. One EXISTS on the first write of a day only.
  return refused({ERR_BAD_PROOF, 'day ' .. day_text .. ': a bucket exists although the meta ' ..
    'proves no group there (left from a mailbox whose keys were lost)'})
end
if not had_proof then
  load_range(m)
  -- The first write of a day: the day set must hold what the meta counts, or the new day would
  -- be added to what is left of a lost set, and scans would serve it as the whole mailbox.
  local lost_days = day_set_lost(m, days_key)
  if lost_days then return refused(lost_days) end
  local day = tonumber(day_text)
  low, high = day, day
  local min_day, max_day = tonumber(m.min_day), tonumber(m.max_day)
  if min_day and min_day < low then low = min_day end
  if max_day and max_day > high then high = max_day end
  if high - low > tonumber(ARGV[9]) then
    return refused({ERR_SPAN, string.format('%d', low), string.format('%d', high), day_text})
  end
end

-- A day with a proof of live groups must still have its bucket: adding to a bucket that was
-- lost would make it look whole again. Its expiry is set before the write (EXPIREAT answers 0
-- for a missing key), so the check costs no command. A bucket of a day wholly below the trim may
-- be gone (truncate emptied it): it is written anew.
local bucket_expiry_set = known and known.bucket_expiry[day_key] == expires_text
if had_proof and not bucket_expiry_set then
  local alive = redis.call('EXPIREAT', day_key, expires_text) == 1
  if not alive and not seq_less(m.proof, m.trim) then
    return refused(lost_bucket(day_text, m.proof))
  end
  bucket_expiry_set = alive
  if known and alive then known.bucket_expiry[day_key] = expires_text end
end

-- Insert: events, identity (its TTL never below the largest live expiry), day member, proofs,
-- range, count, first expiry, seqbucket_max_seq.
establish_epoch()
zadd_argv(day_key, seq, members_from, ARGV)
if not bucket_expiry_set then
  redis.call('EXPIREAT', day_key, expires_text)
  if known then known.bucket_expiry[day_key] = expires_text end
end
redis.call('ZADD', seqbucket_key, expires_text, seq16)
if index_expiry == -2 or index_expiry < tonumber(expires_text) then
  -- A new index (its only member is this one), or a later day than any before: the key's expiry
  -- is the largest score, only ever raised.
  redis.call('EXPIREAT', seqbucket_key, expires_text)
  if known then known.index_expiry = tonumber(expires_text) end
end
local fields = {}
if not m.exists then fields = new_meta_fields() end
fields[#fields + 1] = 'seqbucket_max_seq'
fields[#fields + 1] = seq_max(m.seqbucket_max, seq)
if incoming_position ~= '' then
  fields[#fields + 1] = position_key
  fields[#fields + 1] = stored_position('i')
end
if had_proof then
  fields[#fields + 1] = 'bucket_max_seq:' .. day_text
  fields[#fields + 1] = seq_max(m.proof, seq)
else
  fields[#fields + 1] = 'bucket_max_seq:' .. day_text
  fields[#fields + 1] = seq
  fields[#fields + 1] = 'bucket_expires_at:' .. day_text
  fields[#fields + 1] = expires_text
  if redis.call('ZADD', days_key, expires_text, day_text) == 1 then
    local next_expiry = tonumber(m.next_expiry)
    local expires_at = tonumber(expires_text)
    if not next_expiry or expires_at < next_expiry then next_expiry = expires_at end
    fields[#fields + 1] = 'active_day_count'
    fields[#fields + 1] = string.format('%d', (tonumber(m.day_count) or 0) + 1)
    fields[#fields + 1] = 'min_day'
    fields[#fields + 1] = string.format('%d', low)
    fields[#fields + 1] = 'max_day'
    fields[#fields + 1] = string.format('%d', high)
    fields[#fields + 1] = 'next_expires_at'
    fields[#fields + 1] = string.format('%d', next_expiry)
  end
end
hset_known(meta_key, fields, known and known.meta)
hdel_known(meta_key, stale_position_fields(m, incoming_position), known and known.meta)
return {1, promoted}
