--[[
  Promote one mailbox on demand (the patrol and `materializer promote`); SPEC 4.5.

  KEYS[1]  P:epoch:{user}   KEYS[2]  P:mbmeta:{user}:<epoch>
  KEYS[3]  P:mbseqbucket:{user}:<epoch>   KEYS[4]  P:mbdays:{user}:<epoch>
  KEYS[5]  P:mbday:{user}:<epoch>:  (unused)
  KEYS[6]  P:repair:{user}           (unused; every script takes the same six keys)
  ARGV[1]  epoch

  Returns {0, expired_days, expired_gap_boundary} (zeros for a mailbox that is not the user's
  current one or has no meta), or ERR_UNSUPPORTED_FORMAT found, ERR_BAD_PROOF detail.
]]
local epoch_key, meta_key, seqbucket_key, days_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if rcall('GET', epoch_key) ~= ARGV[1] then return {0, 0, '0'} end
local err = check_format(meta_key)
if err then return err end
if rcall('EXISTS', meta_key) == 0 then return {0, 0, '0'} end
local now = now_seconds()
local expired, perr = promote(meta_key, days_key, seqbucket_key, now)
if perr then return perr end
local boundary = rcall('HGET', meta_key, 'expired_gap_boundary') or '0'
return {0, expired, boundary}
