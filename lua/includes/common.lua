--[[
  Shared helpers of every script: reply codes, the repair fence, time, seq arithmetic on decimal
  strings, key building for other epochs, and writing many members in bounded calls.

  Seqs go up to 9,999,999,999,999,999, beyond the 2^53 a Lua number holds exactly, so seqs are
  handled as strings: canonical decimals (no leading zero) in the meta and the arguments, compared
  by length and then text (`seq_less`, exact for any u64 a caller passes, without building a
  string), and stored as 16-digit members; `pad` compares padded members with canonical seqs.

  Cost notes (measured with callgrind on redis-server, see BENCHMARKS.md): Redis runs a script's
  whole text on every call, so every helper below is a closure built on every call, and each
  local it captures costs a walk of Lua's open-upvalue list. Helpers therefore capture nothing
  but each other: they call `redis.call` directly and write reply codes as literals (named in the
  comment next to each). Arguments go to `redis.call` as the strings the caller sent, never as Lua
  numbers (a number argument is formatted with printf on every call).
]]

-- Reply codes, mirrored by `ScriptCode` in src/store/redis/scripts.rs. Script bodies use these
-- names; helpers write the same numbers as literals.
local ERR_FUTURE = -1
local ERR_SPAN = -2
local ERR_CROSS_DAY = -3
local ERR_UNSUPPORTED_FORMAT = -10
local ERR_INDEX_LOST = -11
local ERR_META_LOST = -12
local ERR_IDENTITY_MISSING = -13
local ERR_BAD_PROOF = -14
local ERR_EPOCH_MISMATCH = -20
local ERR_CURSOR_TRIMMED = -30
local ERR_CURSOR_GAP = -31
local ERR_UNDER_REPAIR = -40
local ERR_FENCE_LOST = -41
local ERR_STORE_LOST = -42

-- SPEC 7.3, a wiped store or master: KEYS[7] is the store marker of the user's slot when the
-- caller knows the slot holds data, else KEYS[6] again (see src/store/redis/store_marker.rs).
-- `present`: whether the marker exists (read by the caller, or here with one EXISTS). Returns
-- nil when the call may go on, else the reply: the slot's data is gone, nothing is read or
-- written until an operator says what to do.
local function store_lost(present)
  if KEYS[7] == KEYS[6] then return nil end
  if present == nil then present = redis.call('EXISTS', KEYS[7]) == 1 end
  if present then return nil end
  return {ERR_STORE_LOST, KEYS[7]}
end

-- The repair fence (SPEC 7.1) guards both copies of a user. A live write (`holder` empty) is
-- refused while ANY fence exists; a staged write (`holder` = the repair's id) goes only while
-- that repair still holds the fence. `current` is the fence key's value (false when absent),
-- read before anything else. Returns nil when the write may go, else the reply to return as it
-- is.
local function fence_verdict(current, holder)
  if holder == '' then
    if current then return {-40 --[[under_repair]], current} end
  elseif current ~= holder then
    return {-41 --[[fence_lost]], current or ''}
  end
  return nil
end

-- Durable before commit (store.redis.wait_replicas > 0): the caller sends `WAIT` right after the
-- script, on the same connection. WAIT covers this connection's last write that was propagated
-- to replicas; a script that writes nothing (an identical replay, a trim, a refusal) propagates
-- nothing, so on a fresh connection its WAIT would prove nothing about the writes its answer
-- relies on. Rewriting the epoch key with its own value (`current`, just read) always propagates
-- (SET does); done first in the script, it follows every write made before the script in the
-- replication stream, and the script's own writes follow it, so the acknowledgement of the
-- script's effects covers all the state its answer was read from. A user without an epoch key
-- has nothing stored to cover.
local function propagate_for_wait(epoch_key, current)
  if current then redis.call('SET', epoch_key, current) end
end

-- Current Unix second from the server's own clock: the only "now" a script uses. As a number,
-- or as the canonical decimal TIME answers (compared with `seq_less`, no conversion).
local function now_seconds()
  return tonumber(redis.call('TIME')[1])
end
local function now_text()
  return redis.call('TIME')[1]
end

-- A decimal seq (padded or not) as 20 digits, for comparisons with 16-digit members.
local function pad(seq)
  return string.rep('0', 20 - #seq) .. seq
end

-- a < b for canonical decimals (no leading zero): the shorter is smaller, equal lengths compare
-- as text.
local function seq_less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

-- The larger of two canonical seqs.
local function seq_max(a, b)
  if #a ~= #b then
    if #a < #b then return b end
    return a
  end
  if a < b then return b end
  return a
end

-- True when `s` is a canonical decimal (no leading zero) of at most 16 digits: what every seq
-- field of the meta must be.
local function is_seq(s)
  return type(s) == 'string' and (s == '0' or (#s <= 16 and string.match(s, '^[1-9]%d*$') ~= nil))
end

-- Keys of one epoch of a copy of the user (same hash tag, so the same slot). `stem` is `P:` for
-- the live copy and `P:stg` for a repair's staging copy (see src/store/redis/keys.rs).
local function epoch_keys(stem, tag, epoch)
  local suffix = tag .. ':' .. epoch
  return {
    meta = stem .. 'mbmeta:' .. suffix,
    seqbucket = stem .. 'mbseqbucket:' .. suffix,
    days = stem .. 'mbdays:' .. suffix,
    day_prefix = stem .. 'mbday:' .. suffix .. ':',
  }
end

-- Deletes every key of one epoch: bounded by the day set (<= 31 buckets) plus three keys.
local function delete_epoch(keys)
  local days = redis.call('ZRANGE', keys.days, 0, -1)
  for _, day in ipairs(days) do
    redis.call('DEL', keys.day_prefix .. day)
  end
  redis.call('DEL', keys.meta, keys.seqbucket, keys.days)
end

-- ZADDs every member of argv[from..] with one score (a decimal string), in calls of at most
-- 1,000 pairs: Lua 5.1's unpack stops near 8,000 values, and a group may hold 10,000 events
-- (MAX_EVENTS_PER_GROUP). `argv` is the caller's ARGV, passed in: inside `append_run.lua` a
-- group's arguments are a slice of the script's, never the global ARGV.
local function zadd_argv(key, score, from, argv)
  for i = from, #argv, 1000 do
    local args = {}
    for j = i, math.min(i + 999, #argv) do
      args[#args + 1] = score
      args[#args + 1] = argv[j]
    end
    redis.call('ZADD', key, unpack(args))
  end
end

-- ZREMs every member of `members`, in calls of at most 1,000 members (see `zadd_argv`).
local function zrem_all(key, members)
  for i = 1, #members, 1000 do
    redis.call('ZREM', key, unpack(members, i, math.min(i + 999, #members)))
  end
end
