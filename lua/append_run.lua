--[[
  Append a run: consecutive groups of ONE mailbox, in source order, in one script call, each
  decided exactly as `append.lua` decides it alone (this script runs that very body once per
  group, as `append_one`), so nothing else touches the mailbox between two of them.

  KEYS[1..7]  as `append.lua` (the same mailbox for every group of the run)

  ARGV        the groups, one after another, each as a count and then exactly the ARGV
              `append.lua` takes for it alone:
              n1, argv1[1..n1], n2, argv2[1..n2], ...
              The first entry is the list of the reply codes that are FINAL answers (outcomes
              and refusals decided from the input: the caller's `StoreError::is_final`), as
              ',code,code,...,' so this script holds no classification of its own.

  Returns one `append.lua` reply per group, in order, and stops after the first reply that is
  not final (corrupt, under repair, fence lost): that group and every later one were not
  applied, and the caller sends them again. Positive codes 1..6 and 8 are outcomes and final; a
  refusal after promote (7) is final when the refusal it carries is.

  The groups share what the call already read or wrote of the mailbox (`known`, see
  append.lua): the fence and epoch `MGET`, `TIME`, the meta `HMGET` and the identity index's
  `EXPIRETIME` once per run, so a warm insert after the first costs its `ZSCORE`, the two `ZADD`s
  and the meta `HSET`.

  Bound: the caller sends at most RUN_MAX_GROUPS (64) groups and RUN_MAX_BYTES (1 MiB) of
  payload per run, its first group whatever its size (src/ingest/pipeline.rs), so one call
  does at most 64 `append.lua` bodies' work over at most 1 MiB (or one group at the record
  limit, as a single append already may): a few milliseconds of server time for 64 warm
  appends of small groups, about what one large group costs alone.
]]
local final_codes = ARGV[1]

local function is_final(reply)
  local code = reply[1]
  if code == 7 then code = reply[3] end
  if type(code) ~= 'number' then return false end
  if code > 0 then return true end
  return string.find(final_codes, ',' .. code .. ',', 1, true) ~= nil
end

local replies = {}
local at = 2
while at <= #ARGV do
  local n = tonumber(ARGV[at])
  local argv = {}
  for i = 1, n do argv[i] = ARGV[at + i] end
  local reply = append_one(argv)
  replies[#replies + 1] = reply
  if not is_final(reply) then break end
  at = at + n + 1
end
return replies
