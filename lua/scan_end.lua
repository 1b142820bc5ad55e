--[[
  The post-read step of RangeScan (SPEC 4.4 step 7): promote again and refuse a page whose
  coverage expiry (or an expired replay, or a trim) crossed while the buckets were being read.

  KEYS[1..6] and ARGV[1..3] as in scan_begin.lua; ARGV[4..] the days whose read found no member:
  a live day whose bucket is gone (evicted, deleted, not restored) fails the page
  (`check_buckets_present`). A day that answered members had its bucket when it was read, and
  nothing writes a lost bucket anew (append.lua refuses), so no other day needs a look.

  Returns {0}, or ERR_EPOCH_MISMATCH current, ERR_UNSUPPORTED_FORMAT found, ERR_BAD_PROOF
  detail, ERR_CURSOR_TRIMMED user_trim_seq, ERR_CURSOR_GAP boundary.

  Commands on the common path: GET, one HMGET of the meta, TIME; one EXISTS when a day's read
  found nothing.
]]
local epoch_key, meta_key, seqbucket_key, days_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local current = redis.call('GET', epoch_key)
if current ~= ARGV[1] then return {ERR_EPOCH_MISMATCH, current or ''} end
local m, err = scan_meta(meta_key, seqbucket_key, days_key, ARGV[2], ARGV[3],
  {ERR_BAD_PROOF, "meta disappeared between the scan's read and its check"})
if not m then return err end
-- A day that expired during the read lost its proof to the promote above, so its missing
-- bucket is no damage; a day emptied by a truncate has its proof below the trim.
err = check_buckets_present(m, KEYS[5], {unpack(ARGV, 4)})
if err then return err end
return {0}
