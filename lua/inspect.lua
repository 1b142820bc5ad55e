--[[
  Read-only dump of a mailbox's metadata, as stored (no promote), in one atomic step.

  KEYS[1]  P:epoch:{user}   KEYS[2]  P:mbmeta:{user}:<epoch>   KEYS[3]  P:mbseqbucket:{user}:<epoch>
  KEYS[4..6] the day set, the day-bucket prefix and the repair fence (unused; every script takes
           the same six keys)
  ARGV[1]  optional: 'positions' (below)

  Returns {current_epoch or '', identity_count, identity_index_present (0/1), field, value, ...}
  with every field of the meta hash.
  With ARGV[1] = 'positions': {now (the server's TIME, seconds), seq, position or '', ...} for
  each identity member whose day has not expired by now, in seq order, the position being the
  meta's `pos:<seq>` (`partition:offset@log`).
]]
local current = redis.call('GET', KEYS[1]) or ''
if ARGV[1] == 'positions' then
  local now = tonumber(redis.call('TIME')[1])
  local reply = {now}
  -- Members are 16-digit seqs, so the score order (expiry) is not the seq order: sort them.
  local members = redis.call('ZRANGE', KEYS[3], '(' .. now, '+inf', 'BYSCORE')
  table.sort(members)
  for i = 1, #members, 1000 do
    local fields = {}
    for j = i, math.min(i + 999, #members) do
      fields[#fields + 1] = 'pos:' .. (string.match(members[j], '^0*(%d-)$') or '0')
    end
    local positions = redis.call('HMGET', KEYS[2], unpack(fields))
    for j = i, math.min(i + 999, #members) do
      reply[#reply + 1] = members[j]
      reply[#reply + 1] = positions[j - i + 1] or ''
    end
  end
  return reply
end
local reply = {current, redis.call('ZCARD', KEYS[3]), redis.call('EXISTS', KEYS[3])}
for _, v in ipairs(redis.call('HGETALL', KEYS[2])) do reply[#reply + 1] = v end
return reply
