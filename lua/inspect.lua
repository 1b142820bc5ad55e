--[[
  Read-only dump of a mailbox's metadata, as stored (no promote), in one atomic step.

  KEYS[1]  P:epoch:{user}   KEYS[2]  P:mbmeta:{user}:<epoch>   KEYS[3]  P:mbseqbucket:{user}:<epoch>
  KEYS[4..6] the day set, the day-bucket prefix and the repair fence (unused; every script takes
           the same six keys)

  Returns {current_epoch or '', identity_count, identity_index_present (0/1), field, value, ...}
  with every field of the meta hash.
]]
local current = redis.call('GET', KEYS[1]) or ''
local reply = {current, redis.call('ZCARD', KEYS[3]), redis.call('EXISTS', KEYS[3])}
for _, v in ipairs(redis.call('HGETALL', KEYS[2])) do reply[#reply + 1] = v end
return reply
