"""Cached answers in Redis (``CacheStore``), shared by replicas.

Keys per namespace ``ns`` (``P`` = the prefix):

- ``P cache:ns:e:KEY``: a hash per entry (value, embedding, tags as JSON, created_at,
  expires_at) that Redis deletes at expires_at (PEXPIREAT).
- ``P cache:ns:lru``: zset, score = when last used (the Redis server's ``TIME``, one clock for
  every replica); eviction pops its lowest.
- ``P cache:ns:created``: zset, score = created_at; ``added_since`` reads it.
- ``P cache:ns:expires``: zset, score = expires_at. A hash that Redis expired leaves its key in
  the zsets; this zset finds those keys without checking every one, so ``put`` drops them before
  evicting live entries and ``stats`` counts only live ones.
- ``P cache:ns:sizes`` (hash, key -> num_bytes) and ``P cache:ns:bytes`` (the sum): an expired
  hash is gone when it is noticed, so its size is kept here to subtract it exactly.

Every change is one Lua script, so the zsets, the sizes and the hashes change together and two
replicas evicting at once cannot over-evict. Scripts name the entry hashes they reach from the
zsets by a key prefix in ARGV (one Redis, not a cluster, like the limit scripts). A hash evicted by
a Redis ``maxmemory`` policy is forgotten when ``get``, ``added_since`` or ``flush`` meets it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import orjson

from titan.storage.base import CacheEntry
from titan.storage.redis_errors import translates_errors

if TYPE_CHECKING:
    from redis.asyncio import Redis

DEFAULT_PREFIX = "titan:"
FLUSH_PAGE = 500  # keys per flush script: each script blocks Redis only briefly
FIELDS = ("value", "embedding", "tags", "created_at", "expires_at")

# KEYS: lru, created, expires, sizes, bytes (then, per script, entry hashes). ARGV[1]: the entry
# hash prefix. ``forget`` removes every trace of a key; ``sweep`` forgets the expired keys.
LUA_COMMON = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function fmt(x) return string.format('%.17g', x) end
local function forget(key)
  local size = redis.call('HGET', KEYS[4], key)
  redis.call('DEL', ARGV[1] .. key)
  redis.call('ZREM', KEYS[1], key)
  redis.call('ZREM', KEYS[2], key)
  redis.call('ZREM', KEYS[3], key)
  if size then
    redis.call('HDEL', KEYS[4], key)
    -- An empty namespace leaves no key behind (its zsets vanish when empty too).
    if redis.call('DECRBY', KEYS[5], size) == 0 then redis.call('DEL', KEYS[5]) end
  end
end
local function sweep()
  local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', fmt(now))
  for _, key in ipairs(expired) do forget(key) end
  return expired
end
-- value, embedding, tags, created_at, expires_at of a live entry; nil (and forgotten) otherwise.
local function live(key)
  local fields = redis.call('HMGET', ARGV[1] .. key, 'value', 'embedding', 'tags',
                            'created_at', 'expires_at')
  if fields[1] and tonumber(fields[5]) > now then return fields end
  if redis.call('HEXISTS', KEYS[4], key) == 1 then forget(key) end
  return nil
end
"""

# ARGV: prefix, key. Returns the entry's fields, or nil.
# allow-oom: a lookup (its LRU touch) keeps serving hits when Redis is out of memory.
GET = (
    "#!lua flags=allow-oom\n"
    + LUA_COMMON
    + """
local fields = live(ARGV[2])
if fields then redis.call('ZADD', KEYS[1], fmt(now), ARGV[2]) end
return fields
"""
)

# KEYS[6]: the entry hash. ARGV: prefix, key, value, has_embedding, embedding, tags, created_at,
# expires_at, expire_at_ms, num_bytes, max_entries. Returns the evicted keys (expired first).
# The "#!lua" line (Redis 7) declares a script that writes: Redis refuses it up front when out
# of memory (OOM), instead of letting it run past maxmemory once its first command (DEL) wrote.
PUT = (
    "#!lua\n"
    + LUA_COMMON
    + """
local key = ARGV[2]
local old = tonumber(redis.call('HGET', KEYS[4], key) or '0')
redis.call('DEL', KEYS[6])
redis.call('HSET', KEYS[6], 'value', ARGV[3], 'tags', ARGV[6], 'created_at', ARGV[7],
           'expires_at', ARGV[8])
if ARGV[4] == '1' then redis.call('HSET', KEYS[6], 'embedding', ARGV[5]) end
redis.call('PEXPIREAT', KEYS[6], ARGV[9])
redis.call('ZADD', KEYS[1], fmt(now), key)
redis.call('ZADD', KEYS[2], ARGV[7], key)
redis.call('ZADD', KEYS[3], ARGV[8], key)
redis.call('HSET', KEYS[4], key, ARGV[10])
redis.call('INCRBY', KEYS[5], tonumber(ARGV[10]) - old)
local evicted = sweep()
local max_entries = tonumber(ARGV[11])
while redis.call('ZCARD', KEYS[1]) > max_entries do
  local popped = redis.call('ZPOPMIN', KEYS[1])
  forget(popped[1])
  evicted[#evicted + 1] = popped[1]
end
return evicted
"""
)

# ARGV: prefix, key. Returns 1 when a live entry was deleted.
DELETE = (
    LUA_COMMON
    + """
local was_live = live(ARGV[2]) ~= nil
forget(ARGV[2])
return was_live and 1 or 0
"""
)

# ARGV: prefix, since, limit. Returns {key, fields...} per live entry created after since, oldest
# first (ties by key: zset order), up to limit. Atomic, so no page is skipped or read twice while
# other replicas write; keys found dead are forgotten after the walk, which would shift it.
ADDED_SINCE = (
    LUA_COMMON
    + """
local limit, offset, found, dead = tonumber(ARGV[3]), 0, {}, {}
while #found < limit do
  local keys = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[2], '+inf', 'LIMIT', offset, 256)
  if #keys == 0 then break end
  offset = offset + #keys
  for _, key in ipairs(keys) do
    local fields = redis.call('HMGET', ARGV[1] .. key, 'value', 'embedding', 'tags',
                              'created_at', 'expires_at')
    if fields[1] and tonumber(fields[5]) > now then
      if #found < limit then found[#found + 1] = {key, unpack(fields)} end
    else
      dead[#dead + 1] = key
    end
  end
end
for _, key in ipairs(dead) do forget(key) end
return found
"""
)

# ARGV: prefix, tenant, match_tenant, model, match_model, then the keys to check. Returns how
# many live entries matched (and were deleted).
FLUSH = (
    LUA_COMMON
    + """
sweep()
local n = 0
for i = 6, #ARGV do
  local key = ARGV[i]
  local fields = live(key)
  if fields then
    local tags = cjson.decode(fields[3])
    if (ARGV[3] ~= '1' or tags['tenant'] == ARGV[2])
        and (ARGV[5] ~= '1' or tags['model'] == ARGV[4]) then
      forget(key)
      n = n + 1
    end
  end
end
return n
"""
)

# Returns {entries, bytes} of the live entries.
STATS = (
    LUA_COMMON
    + """
sweep()
return {redis.call('ZCARD', KEYS[1]), tonumber(redis.call('GET', KEYS[5]) or '0')}
"""
)


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _entry(key: bytes | str, fields: list[Any]) -> CacheEntry:
    value, embedding, tags, created_at, expires_at = fields
    return CacheEntry(
        key=_text(key),
        value=value,
        created_at=float(created_at),
        expires_at=float(expires_at),
        tags=orjson.loads(tags),
        embedding=embedding,
    )


@translates_errors
class RedisCache:
    def __init__(self, client: Redis, *, prefix: str = DEFAULT_PREFIX) -> None:
        self._client = client
        self._prefix = prefix
        # register_script does no I/O: it sends EVALSHA, and the script itself on NOSCRIPT.
        self._get = client.register_script(GET)
        self._put = client.register_script(PUT)
        self._delete = client.register_script(DELETE)
        self._added_since = client.register_script(ADDED_SINCE)
        self._flush = client.register_script(FLUSH)
        self._stats = client.register_script(STATS)

    def _keys(self, namespace: str) -> list[str]:
        base = f"{self._prefix}cache:{namespace}:"
        return [base + name for name in ("lru", "created", "expires", "sizes", "bytes")]

    def _entry_prefix(self, namespace: str) -> str:
        return f"{self._prefix}cache:{namespace}:e:"

    async def get(self, namespace: str, key: str) -> CacheEntry | None:
        prefix = self._entry_prefix(namespace)
        keys = [*self._keys(namespace), prefix + key]
        fields = await self._get(keys=keys, args=[prefix, key])
        return None if fields is None else _entry(key, fields)

    async def put(self, namespace: str, entry: CacheEntry, *, max_entries: int) -> list[str]:
        prefix = self._entry_prefix(namespace)
        keys = [*self._keys(namespace), prefix + entry.key]
        args: list[Any] = [
            prefix,
            entry.key,
            entry.value,
            "0" if entry.embedding is None else "1",
            entry.embedding or b"",
            orjson.dumps(dict(entry.tags)),
            repr(float(entry.created_at)),  # repr round-trips a float exactly
            repr(float(entry.expires_at)),
            # Rounded up: Redis never drops the hash before the entry expires (scripts compare
            # expires_at itself with the server clock).
            math.ceil(entry.expires_at * 1000),
            entry.num_bytes,
            max_entries,
        ]
        return [_text(key) for key in await self._put(keys=keys, args=args)]

    async def delete(self, namespace: str, key: str) -> bool:
        prefix = self._entry_prefix(namespace)
        return bool(await self._delete(keys=self._keys(namespace), args=[prefix, key]))

    async def flush(
        self, namespace: str, *, tenant: str | None = None, model: str | None = None
    ) -> int:
        prefix = self._entry_prefix(namespace)
        keys = self._keys(namespace)
        head = [prefix, tenant or "", int(tenant is not None), model or "", int(model is not None)]
        # ZSCAN returns every key present for the whole scan at least once, whatever is deleted
        # meanwhile; a key seen twice is already gone (not live) the second time, so not counted.
        flushed, page = 0, []
        async for key, _ in self._client.zscan_iter(keys[1], count=FLUSH_PAGE):
            page.append(key)
            if len(page) >= FLUSH_PAGE:
                flushed += await self._flush(keys=keys, args=head + page)
                page = []
        # The last page, and the sweep of expired keys even when nothing was found.
        flushed += await self._flush(keys=keys, args=head + page)
        return flushed

    async def added_since(
        self, namespace: str, since: float, *, limit: int = 10_000
    ) -> list[CacheEntry]:
        if limit <= 0:
            return []
        args = [self._entry_prefix(namespace), repr(float(since)), limit]
        rows = await self._added_since(keys=self._keys(namespace), args=args)
        return [_entry(row[0], row[1:]) for row in rows]

    async def stats(self, namespace: str) -> dict[str, int]:
        args = [self._entry_prefix(namespace)]  # the sweep deletes hashes by this prefix
        entries, num_bytes = await self._stats(keys=self._keys(namespace), args=args)
        return {"entries": int(entries), "bytes": int(num_bytes)}
