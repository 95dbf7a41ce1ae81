"""The Lua scripts of ``titan.storage.redis_jobs``: each is one atomic step of the queue.

Every script that changes a job takes its keys in the order of ``RedisJobQueue._keys``:

    1 job hash (fields doc, entry)   2 schedule ZSET of its priority   3 leases ZSET
    4 expiry ZSET                    5 ready stream of its priority
    6-9 counter hashes (all, tenant, batch, tenant+batch; '' when the job has no batch)
    10 idempotency key ('' when none)   11 tenant index ZSET   12 tenant+batch index ZSET ('')

Scores arrive as Python ``repr`` strings and go to ZADD unchanged (no Lua float arithmetic), and
documents are compared and stored as the exact bytes Python wrote, so nothing is re-encoded here.
Keys reached through ids found inside a script (job hashes) are built from a prefix in ARGV: one
Redis, not a cluster, like ``titan.storage.redis_cache``.
"""

from __future__ import annotations

# ``transition(K, A)``: write a job's new document if the stored one is still ``expected``, and
# bring every index in line with the new state in the same step. A: id, expected ('' = no job
# yet), doc, old state ('' = new job), new state, run_at, lease_until, expires_at ('' = none),
# consumer (a re-leased job's pending entry moves to it; '' = keep), group.
LUA_TRANSITION = """
local function transition(K, A)
  local id, old, new = A[1], A[4], A[5]
  local stored = redis.call('HGET', K[1], 'doc')
  if A[2] == '' then
    if stored then return 0 end
  elseif stored ~= A[2] then
    return 0
  end
  redis.call('HSET', K[1], 'doc', A[3])
  if old ~= new then
    for i = 6, 9 do
      if K[i] ~= '' then
        if old ~= '' and redis.call('HINCRBY', K[i], old, -1) <= 0 then
          redis.call('HDEL', K[i], old)
        end
        redis.call('HINCRBY', K[i], new, 1)
      end
    end
  end
  if new == 'queued' then redis.call('ZADD', K[2], A[6], id) else redis.call('ZREM', K[2], id) end
  if new == 'running' then redis.call('ZADD', K[3], A[7], id) else redis.call('ZREM', K[3], id) end
  if A[8] ~= '' then redis.call('ZADD', K[4], A[8], id) end
  local entry = redis.call('HGET', K[1], 'entry')
  if entry and new == 'running' then
    if A[9] ~= '' then redis.call('XCLAIM', K[5], A[10], A[9], 0, entry, 'JUSTID') end
  elseif entry then
    -- Its delivery is over (final, or back in the schedule for a retry): the pending entry
    -- list and the stream drop it.
    redis.call('XACK', K[5], A[10], entry)
    redis.call('XDEL', K[5], entry)
    redis.call('HDEL', K[1], 'entry')
  end
  return 1
end
"""

# KEYS, ARGV: one job's first 9 keys and transition's A. Returns 1 when it wrote.
TRANSITION = LUA_TRANSITION + "return transition(KEYS, ARGV)\n"

# KEYS: the priorities ZSET, then 12 keys per job. ARGV: the job hash prefix, the group, then
# (id, doc, run_at, priority, created_at) per job. Returns per job '' (added) or the stored doc
# of the job returned in its place (same id, or its idempotency key taken).
SUBMIT = (
    LUA_TRANSITION
    + """
local reply = {}
for j = 0, (#KEYS - 1) / 12 - 1 do
  local K, a = {}, 2 + j * 5
  for i = 1, 12 do K[i] = KEYS[1 + j * 12 + i] end
  local id = ARGV[a + 1]
  local existing = redis.call('HGET', K[1], 'doc')
  if not existing and K[10] ~= '' and not redis.call('SET', K[10], id, 'NX') then
    existing = redis.call('HGET', ARGV[1] .. redis.call('GET', K[10]), 'doc')
    if not existing then redis.call('SET', K[10], id) end  -- its job is gone: the key is free
  end
  if existing then
    reply[j + 1] = existing
  else
    transition(K, {id, '', ARGV[a + 2], '', 'queued', ARGV[a + 3], '', '', '', ARGV[2]})
    redis.call('ZADD', KEYS[1], ARGV[a + 4], ARGV[a + 4])
    redis.call('ZADD', K[11], ARGV[a + 5], id)
    if K[12] ~= '' then redis.call('ZADD', K[12], ARGV[a + 5], id) end
    reply[j + 1] = ''
  end
end
return reply
"""
)

# KEYS: schedule, ready stream (one priority), leases. ARGV: now, count, group, consumer, job hash
# prefix, provisional lease_until. Moves up to count due jobs (oldest run_at first) from the
# schedule to the stream, then reads up to count new entries for the consumer. Each delivered job
# gets a provisional lease, so one whose claimer dies before taking it is found by the lease scan.
# Returns {entry id, job id, doc (false for a stale entry, acknowledged)} per entry read.
DELIVER = """
local group, prefix = ARGV[3], ARGV[5]
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[2], group, '0', 'MKSTREAM')
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HSET', prefix .. id, 'entry', redis.call('XADD', KEYS[2], '*', 'id', id))
end
local read = redis.call('XREADGROUP', 'GROUP', group, ARGV[4], 'COUNT', tonumber(ARGV[2]),
                        'STREAMS', KEYS[2], '>')
local reply = {}
if not read then return reply end
for _, item in ipairs(read[1][2]) do
  local eid, id = item[1], item[2][2]
  local fields = redis.call('HMGET', prefix .. id, 'doc', 'entry')
  if fields[2] == eid then
    redis.call('ZADD', KEYS[3], ARGV[6], id)
    reply[#reply + 1] = {eid, id, fields[1]}
  else
    -- Stale: its job is gone or no longer waits on this entry.
    redis.call('XACK', KEYS[2], group, eid)
    redis.call('XDEL', KEYS[2], eid)
    reply[#reply + 1] = {eid, id, false}
  end
end
return reply
"""

# KEYS: the index ZSET. ARGV: after ('' = from the newest), count. Ids newest first (score, then
# id, descending); false when ``after`` is not in the index.
PAGE = """
local start = 0
if ARGV[1] ~= '' then
  local rank = redis.call('ZREVRANK', KEYS[1], ARGV[1])
  if not rank then return false end
  start = rank + 1
end
return redis.call('ZREVRANGE', KEYS[1], start, start + tonumber(ARGV[2]) - 1)
"""

# KEYS: 12 per job. ARGV: (id, expected doc, state) per job. Deletes each finished job still
# stored as expected, with its index entries, counts and idempotency key; returns how many.
PURGE = """
local purged = 0
for j = 0, #KEYS / 12 - 1 do
  local K, id, state = {}, ARGV[j * 3 + 1], ARGV[j * 3 + 3]
  for i = 1, 12 do K[i] = KEYS[j * 12 + i] end
  if redis.call('HGET', K[1], 'doc') == ARGV[j * 3 + 2] then
    for i = 6, 9 do
      if K[i] ~= '' and redis.call('HINCRBY', K[i], state, -1) <= 0 then
        redis.call('HDEL', K[i], state)
      end
    end
    if K[10] ~= '' and redis.call('GET', K[10]) == id then redis.call('DEL', K[10]) end
    redis.call('ZREM', K[11], id)
    if K[12] ~= '' then redis.call('ZREM', K[12], id) end
    redis.call('DEL', K[1])
    purged = purged + 1
  end
  redis.call('ZREM', K[4], id)
end
return purged
"""
