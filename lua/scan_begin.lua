--[[
  The pre-read step of RangeScan (SPEC 4.4 steps 1, 3, 4, 5): epoch, format, promote, cursor.
  The reverse-range answer (step 2) happens in the caller after its own epoch check, before any
  other storage read.

  KEYS[1]  P:epoch:{user}   KEYS[2]  P:mbmeta:{user}:<epoch>
  KEYS[3]  P:mbseqbucket:{user}:<epoch>   KEYS[4]  P:mbdays:{user}:<epoch>
  KEYS[5]  P:mbday:{user}:<epoch>:  (unused)
  KEYS[6]  P:repair:{user}           (unused; every script takes the same seven keys)
  KEYS[7]  the slot's store marker, or KEYS[6] (see `store_lost` in common.lua): ERR_STORE_LOST
  ARGV[1]  epoch   ARGV[2]  after_seq   ARGV[3]  after_seq + 1 (plain decimals)

  Returns {1} when there is nothing to read (user never written), ERR_META_LOST when the user's
  epoch has no meta (the two are written together: the meta was lost),
  {0, seqbucket_max_seq, day, day, ...} with every active day to read (the whole day set: the
  true min_day to max_day), or ERR_EPOCH_MISMATCH current, ERR_UNSUPPORTED_FORMAT found,
  ERR_BAD_PROOF detail, ERR_CURSOR_TRIMMED user_trim_seq, ERR_CURSOR_GAP boundary.

  An empty day set while the meta proves a live day is ERR_BAD_PROOF (read only when the day set
  is empty): a page must never claim coverage of groups that were not read. A lost bucket is
  found by scan_end.lua, among the days whose read came back empty.

  Commands on the common path: GET, one HMGET of the meta, TIME, ZRANGE of the day set, HMGET of
  the meta's range (SPEC 7.3: a lost day set is found before a page claims coverage; none when
  promote read it already).
]]
local epoch_key, meta_key, seqbucket_key, days_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local lost = store_lost()
if lost then return lost end
local current = redis.call('GET', epoch_key)
if not current or current ~= ARGV[1] then
  -- SPEC 7.3: no epoch key, or an older one, while this epoch has a mailbox: the key was lost
  -- (and perhaps written again by a stale record). One EXISTS, on this path only.
  if (not current or seq_less(current, ARGV[1])) and redis.call('EXISTS', meta_key) == 1 then
    return epoch_lost(current, ARGV[1], {exists = true})
  end
  if not current then return {1} end
  return {ERR_EPOCH_MISMATCH, current}
end
-- The epoch key and its meta are written together: an epoch without its meta lost it.
local m, answer = scan_meta(meta_key, seqbucket_key, days_key, ARGV[2], ARGV[3], {ERR_META_LOST})
if not m then return answer end
local now = answer
local days = redis.call('ZRANGE', days_key, 0, -1)
-- SPEC 7.3: the day set must hold what the meta counts, or the page would claim coverage of
-- days it never looked at (a lost or partly restored set).
load_range(m)
local lost_days = day_set_lost(m, days_key, #days)
if lost_days then return lost_days end
if #days == 0 then
  -- An empty day set is the rare path (a mailbox without live days): make sure the meta proves
  -- no live day either, or the page would claim coverage up to seqbucket_max_seq of groups it
  -- never looked for (a lost day set).
  local day, max_seq = live_proof(m, now)
  if day then
    return {ERR_BAD_PROOF, 'the day set is missing although the meta proves groups up to seq ' ..
      max_seq .. ' on live day ' .. day .. ' (evicted, deleted or not restored)'}
  end
end
local reply = {0, m.seqbucket_max}
for _, day in ipairs(days) do reply[#reply + 1] = day end
return reply
