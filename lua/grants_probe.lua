--[[
  Which of the commands the mailbox scripts call this ACL user may not run on the key prefix:
  each is called once, by redis.pcall, on probe keys nobody else uses, and whatever it wrote is
  deleted before the script ends (a script is atomic: no reader sees a probe key). Redis checks
  a command's ACL before running it, so a denied command is found whatever the key holds.

  KEYS[1]  P:grants-probe:{tag}:s   a string key     KEYS[2]  P:grants-probe:{tag}:h   a hash
  KEYS[3]  P:grants-probe:{tag}:z   a sorted set     KEYS[4]  P:grants-probe:{tag}:r   a rename target
  ARGV     none

  Returns {missing rule, ...}: `+cmd` for each command denied, `~keys` when the keys themselves
  are out of reach; empty when the user may run every command the scripts need.
]]
local s, h, z, r = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local missing = {}
local keys_denied = false
local function probe(name, ...)
  local reply = redis.pcall(name, ...)
  if type(reply) == 'table' and reply.err then
    local text = string.lower(reply.err)
    if string.find(text, "can't access", 1, true) or string.find(text, 'no permissions to access', 1, true) then
      keys_denied = true
    elseif string.find(text, "can't run this command", 1, true) or string.find(text, 'no permissions to run', 1, true)
      or string.find(text, 'noperm', 1, true) then
      missing[#missing + 1] = '+' .. string.lower(name)
    end
  end
end
probe('SET', s, '1')
probe('GET', s)
probe('MGET', s)
probe('EXISTS', s)
probe('TYPE', s)
probe('EXPIREAT', s, 4102444800)
probe('PEXPIRE', s, 60000)
probe('EXPIRETIME', s)
probe('HSET', h, 'f', '1')
probe('HGET', h, 'f')
probe('HMGET', h, 'f')
probe('HGETALL', h)
probe('HKEYS', h)
probe('HDEL', h, 'f')
probe('ZADD', z, 1, 'm')
probe('ZRANGE', z, 0, -1)
probe('ZSCORE', z, 'm')
probe('ZCOUNT', z, '-inf', '+inf')
probe('ZCARD', z)
probe('ZREM', z, 'm')
probe('ZREMRANGEBYSCORE', z, '-inf', '+inf')
probe('RENAME', s, r)
probe('TIME')
probe('DEL', s, h, z, r)
if keys_denied then missing[#missing + 1] = '~keys' end
return missing
