--[[
  The pre-read step of RangeScan (SPEC 4.4 steps 1, 3, 4, 5): epoch, format, promote, cursor.
  The reverse-range answer (step 2) happens in the caller after its own epoch check, before any
  other storage read.

  KEYS[1]  P:epoch:{user}   KEYS[2]  P:mbmeta:{user}:<epoch>
  KEYS[3]  P:mbseqbucket:{user}:<epoch>   KEYS[4]  P:mbdays:{user}:<epoch>
  KEYS[5]  P:mbday:{user}:<epoch>:  (unused)
  KEYS[6]  P:repair:{user}           (unused; every script takes the same six keys)
  ARGV[1]  epoch   ARGV[2]  after_seq   ARGV[3]  after_seq + 1 (plain decimals)

  Returns {1} when there is nothing to read (user never written, or no meta),
  {0, seqbucket_max_seq, day, day, ...} with every active day to read (the whole day set: the
  true min_day to max_day), or ERR_EPOCH_MISMATCH current, ERR_UNSUPPORTED_FORMAT found,
  ERR_BAD_PROOF detail, ERR_CURSOR_TRIMMED user_trim_seq, ERR_CURSOR_GAP boundary.

  Commands on the common path: GET, one HMGET of the meta, TIME, ZRANGE of the day set.
]]
local epoch_key, meta_key, seqbucket_key, days_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local current = redis.call('GET', epoch_key)
if not current then return {1} end
if current ~= ARGV[1] then return {ERR_EPOCH_MISMATCH, current} end
local m = load_meta(meta_key, 'expired_gap_boundary')
local err = check_format(m)
if err then return err end
if not m.exists then return {1} end
err = meta_seqs(m)
if err then return err end
m.boundary, err = seq_value(m.extra, 'expired_gap_boundary')
if err then return err end
local _, perr = promote(m, days_key, seqbucket_key, now_text())
if perr then return perr end
err = check_cursor(m, ARGV[2], ARGV[3])
if err then return err end
local reply = {0, m.seqbucket_max}
for _, day in ipairs(redis.call('ZRANGE', days_key, 0, -1)) do reply[#reply + 1] = day end
return reply
