--[[
  Names every key a user may hold, in both copies, without a pattern: the fence, both epoch keys,
  and for the epoch each copy names (plus the epochs a caller adds) every key `epoch_key_names`
  lists. Read-only; used to fingerprint a user byte for byte (DUMP of each name that exists).

  KEYS[1]  P:repair:{user}   KEYS[2]  P:epoch:{user}   KEYS[3]  P:stgepoch:{user}
  ARGV[1]  live stem `P:`    ARGV[2]  staging stem `P:stg`   ARGV[3]  hash tag {user}
  ARGV[4]  retention_days    ARGV[5]  future_window_days     ARGV[6..] further epochs to name

  Returns the list of names (some may not exist).
]]
local today = math.floor(now_seconds() / 86400)
local retention_days, future_window = tonumber(ARGV[4]), tonumber(ARGV[5])
local names = {KEYS[1], KEYS[2], KEYS[3]}
local copies = {{ARGV[1], KEYS[2]}, {ARGV[2], KEYS[3]}}
for _, copy in ipairs(copies) do
  local stem, epoch_key = copy[1], copy[2]
  local epochs, seen = {}, {}
  local function add_epoch(e)
    if not seen[e] then
      seen[e] = true
      epochs[#epochs + 1] = e
    end
  end
  if redis.call('TYPE', epoch_key)['ok'] == 'string' then add_epoch(redis.call('GET', epoch_key)) end
  for i = 6, #ARGV do add_epoch(ARGV[i]) end
  for _, e in ipairs(epochs) do
    for _, name in ipairs(epoch_key_names(epoch_keys(stem, ARGV[3], e), today, retention_days,
      future_window)) do
      names[#names + 1] = name
    end
  end
end
return names
