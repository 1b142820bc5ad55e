--[[
  What both steps of RangeScan check the meta for (SPEC 4.4 steps 3 to 5, and again at step 7):
  the format, a meta that is there, its seqs and gap boundary, promote, the cursor. Included by
  scan_begin.lua and scan_end.lua only; each checks the epoch its own way first.
]]

-- Reads and checks the meta for a scan after `after` (`after_plus_one` its successor), and
-- promotes. `lost` is the answer when the meta is missing. Returns m and the server's now, or
-- nil and the error reply.
local function scan_meta(meta_key, seqbucket_key, days_key, after, after_plus_one, lost)
  local m = load_meta(meta_key, {boundary = 'expired_gap_boundary'})
  local err = check_format(m)
  if err then return nil, err end
  if not m.exists then return nil, lost end
  err = meta_seqs(m)
  if err then return nil, err end
  m.boundary, err = seq_value(m.boundary_text, 'expired_gap_boundary')
  if err then return nil, err end
  local now = now_text()
  local _, perr = promote(m, days_key, seqbucket_key, now)
  if perr then return nil, perr end
  err = check_cursor(m, after, after_plus_one)
  if err then return nil, err end
  return m, now
end
