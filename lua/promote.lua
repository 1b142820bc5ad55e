--[[
  Promote one mailbox on demand (the patrol and `materializer promote`); SPEC 4.5.

  KEYS[1]  P:epoch:{user}   KEYS[2]  P:mbmeta:{user}:<epoch>
  KEYS[3]  P:mbseqbucket:{user}:<epoch>   KEYS[4]  P:mbdays:{user}:<epoch>
  KEYS[5]  P:mbday:{user}:<epoch>:  (unused)
  KEYS[6]  P:repair:{user}           (unused; every script takes the same seven keys)
  KEYS[7]  the slot's store marker, or KEYS[6] (see `store_lost` in common.lua): ERR_STORE_LOST
  ARGV[1]  epoch

  Returns {0, expired_days, expired_gap_boundary} (zeros for a mailbox that is not the user's
  current one or has no meta), or ERR_UNSUPPORTED_FORMAT found, ERR_BAD_PROOF detail.
]]
local epoch_key, meta_key, seqbucket_key, days_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local lost = store_lost()
if lost then return lost end
local current = redis.call('GET', epoch_key)
local m = load_meta(meta_key, {boundary = 'expired_gap_boundary'})
-- SPEC 7.3: a lost epoch key, meta or day set is damage, never "nothing to promote".
local err = epoch_lost(current, ARGV[1], m)
if err then return err end
if current ~= ARGV[1] then return {0, 0, '0'} end
err = check_format(m)
if err then return err end
if not m.exists then
  if redis.call('EXISTS', seqbucket_key, days_key) > 0 then return {ERR_META_LOST} end
  return {0, 0, '0'}
end
load_range(m)
err = day_set_lost(m, days_key)
if err then return err end
err = meta_seqs(m)
if err then return err end
m.boundary, err = seq_value(m.boundary_text, 'expired_gap_boundary')
if err then return err end
local expired, perr = promote(m, days_key, seqbucket_key, now_text())
if perr then return perr end
return {0, expired, m.boundary}
