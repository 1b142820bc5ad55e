--[[
  TruncateBefore (SPEC 4.3): raise user_trim_seq (never lower it) and delete every group and
  identity below it, and the source positions of those seqs.

  KEYS[1..7] as in append.lua (epoch, meta, seqbucket, days, day-bucket prefix, repair fence,
  store marker), of
  the live or the staging copy
  ARGV[1]  epoch       ARGV[2]  before_seq, plain decimal
  ARGV[3]  '' (live write) or the repair's holder id (staged write; see `fence_verdict`)
  ARGV[4]  '1' when the caller follows with WAIT (see `propagate_for_wait`), else '0'

  Returns {0, user_trim_seq, removed_groups, promoted_days}, or {7, promoted_days, refusal...}
  when the integrity check refuses after promote compacted days (`after_promote`), or ERR_EPOCH_MISMATCH current,
  ERR_UNSUPPORTED_FORMAT found, ERR_INDEX_LOST, ERR_META_LOST, ERR_BAD_PROOF detail,
  ERR_UNDER_REPAIR holder, ERR_FENCE_LOST.

  A user never written is established at this epoch with the trim, so the trim is durable.
  Work is proportional to the active days and the live identities, both bounded.
]]
local epoch_key, meta_key, seqbucket_key, days_key, day_prefix =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local epoch = ARGV[1]
local before = ARGV[2]

local gate = redis.call('MGET', KEYS[6], epoch_key, KEYS[7])
local lost = ARGV[3] == '' and store_lost(gate[3] ~= false)
if lost then return lost end
local fenced = fence_verdict(gate[1], ARGV[3])
if fenced then return fenced end
if ARGV[4] == '1' then propagate_for_wait(epoch_key, gate[2]) end

local now = now_text()
local current = gate[2]
if current and not string.match(current, '^%d+$') then
  -- A damaged epoch key is damage to the mailbox (corrupt), as in append.lua.
  return {ERR_BAD_PROOF, 'the epoch key holds ' .. current .. ', not an epoch'}
end
if current and current ~= epoch then
  return {ERR_EPOCH_MISMATCH, current}
end

local m = load_meta(meta_key, {})
local err = epoch_lost(current, epoch, m)
if err then return err end
if m.exists then
  load_range(m)
  err = day_set_lost(m, days_key)
  if err then return err end
end
local promoted
err, promoted = prepare_write(m, days_key, seqbucket_key, now)
if err then return err end
err = check_integrity(m, identity_expiry(seqbucket_key) ~= -2, now)
if err then return after_promote(err, promoted) end

if not current then redis.call('SET', epoch_key, epoch) end
ensure_meta(m)
local trim = seq_max(m.trim, before)
redis.call('HSET', meta_key, 'user_trim_seq', trim)
local trim20 = pad(trim)
local trim_score = tonumber(trim)

local removed_seqs = {}
local removed_groups = 0
for _, day in ipairs(redis.call('ZRANGE', days_key, 0, -1)) do
  local day_key = day_prefix .. day
  for _, m in ipairs(redis.call('ZRANGE', day_key, '-inf', trim_score, 'BYSCORE')) do
    local s16 = string.sub(m, 1, 16)
    if pad(s16) < trim20 then
      redis.call('ZREM', day_key, m)
      if not removed_seqs[s16] then
        removed_seqs[s16] = true
        removed_groups = removed_groups + 1
      end
    end
  end
end
local trimmed = {}
for _, s16 in ipairs(redis.call('ZRANGE', seqbucket_key, 0, -1)) do
  if pad(s16) < trim20 then
    redis.call('ZREM', seqbucket_key, s16)
    trimmed[#trimmed + 1] = s16
  end
end
-- The trimmed seqs' source positions go with their identities.
drop_positions(meta_key, trimmed)
return {0, trim, removed_groups, promoted}
