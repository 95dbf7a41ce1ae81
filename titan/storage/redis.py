"""Redis stores: everything replicas share.

Each limit operation is ONE Lua script, so check-then-take is atomic across replicas, and reads
``TIME`` so every replica uses the Redis server's clock. The bucket arithmetic is
``titan.storage.memory``'s, step for step. Scripts return numbers as ``%.17g`` strings: Redis turns
a Lua number reply into an integer, and its own number-to-string conversion keeps 14 digits (too
few for epoch seconds with microseconds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from titan.storage.base import Acquisition, Bucket, ConcurrencySlot, Increment, Settlement
from titan.storage.redis_errors import translates_errors

if TYPE_CHECKING:
    from redis.asyncio import Redis

DEFAULT_PREFIX = "titan:"

# Shared by the scripts: the server clock, exact formatting, and the refill formula of memory.py.
# A bucket key expires once a full refill would have happened (plus a margin), which is exactly
# "never seen", so idle buckets cost no memory.
LUA_COMMON = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function fmt(x) return string.format('%.17g', x) end
local function arg(i) return tonumber(ARGV[i]) end
local function level_of(key, capacity, refill)
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  if not state[1] then return capacity end
  return math.min(capacity, tonumber(state[1]) + math.max(0, now - tonumber(state[2])) * refill)
end
local function store(key, tokens, capacity, refill)
  redis.call('HSET', key, 'tokens', fmt(tokens), 'ts', fmt(now))
  if refill > 0 then
    local ms = math.min(1e13, math.ceil((capacity - tokens) / refill * 1000) + 1000)
    redis.call('PEXPIRE', key, string.format('%.0f', ms))
  else
    redis.call('PERSIST', key)
  end
end
"""

# KEYS: bucket keys, then slot keys. ARGV: num_buckets, num_slots, lease_id, lease_ttl_s, then
# (capacity, refill_per_s, cost) per bucket, then limit per slot.
# Returns {is_admitted, refused_bucket (-1), refused_slot (-1), retry_after ('' or number), now,
#          remaining...}.
ACQUIRE = (
    LUA_COMMON
    + """
local nb, ns = arg(1), arg(2)
local lease_id, ttl = ARGV[3], arg(4)
local capacity, refill, cost = {}, {}, {}
local levels, refused_bucket, refused_slot, retry = {}, -1, -1, ''
for i = 1, nb do
  local a = 4 + (i - 1) * 3
  capacity[i], refill[i], cost[i] = arg(a + 1), arg(a + 2), arg(a + 3)
  levels[i] = level_of(KEYS[i], capacity[i], refill[i])
  if refused_bucket < 0 and levels[i] < cost[i] then
    refused_bucket = i - 1
    if cost[i] > capacity[i] or refill[i] <= 0 then
      retry = 'inf'
    else
      retry = fmt((cost[i] - levels[i]) / refill[i])
    end
  end
end
if refused_bucket < 0 then
  for j = 1, ns do
    local key = KEYS[nb + j]
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
    if redis.call('ZCARD', key) >= arg(4 + nb * 3 + j) then
      refused_slot = j - 1
      break
    end
  end
end
local admitted = refused_bucket < 0 and refused_slot < 0
local reply = {admitted and 1 or 0, refused_bucket, refused_slot, retry, fmt(now)}
for i = 1, nb do
  if admitted then
    levels[i] = levels[i] - cost[i]
    store(KEYS[i], levels[i], capacity[i], refill[i])
  end
  reply[5 + i] = fmt(levels[i])
end
if admitted then
  for j = 1, ns do
    local key = KEYS[nb + j]
    redis.call('ZADD', key, fmt(now + ttl), lease_id)
    -- The zset lives as long as its longest lease, not just the newest one.
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    local ms = math.ceil((tonumber(last[2]) - now) * 1000) + 1000
    redis.call('PEXPIRE', key, string.format('%.0f', ms))
  end
end
return reply
"""
)

# KEYS: slot keys (each once). ARGV: lease_ttl_s, then per key: the number of its leases, then
# their ids. Expired leases are purged first and ZADD XX only updates members still there, so a
# lease released or expired stays gone; the zset then lives as long as its longest lease.
RENEW = (
    LUA_COMMON
    + """
local ttl, a = arg(1), 1
local expires_at = fmt(now + ttl)
for j = 1, #KEYS do
  local key, n = KEYS[j], arg(a + 1)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
  for i = a + 2, a + 1 + n do
    redis.call('ZADD', key, 'XX', expires_at, ARGV[i])
  end
  a = a + 1 + n
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    local ms = math.ceil((tonumber(last[2]) - now) * 1000) + 1000
    redis.call('PEXPIRE', key, string.format('%.0f', ms))
  end
end
return 1
"""
)

# KEYS: bucket keys. ARGV: (capacity, refill_per_s, delta) per bucket.
SETTLE = (
    LUA_COMMON
    + """
for i = 1, #KEYS do
  local a = (i - 1) * 3
  local capacity, refill, delta = arg(a + 1), arg(a + 2), arg(a + 3)
  local tokens = math.min(capacity, level_of(KEYS[i], capacity, refill) + delta)
  store(KEYS[i], tokens, capacity, refill)
end
return 1
"""
)

# KEYS: bucket keys. ARGV: (capacity, refill_per_s) per bucket. Changes nothing.
PEEK = (
    LUA_COMMON
    + """
local reply = {}
for i = 1, #KEYS do
  reply[i] = fmt(level_of(KEYS[i], arg(2 * i - 1), arg(2 * i)))
end
return reply
"""
)

# KEYS: the namespace's id index, then one counter hash per id; ARGV: the ids. Drops ids whose
# hash expired, atomically, so an increment racing the cleanup cannot lose its index entry.
DROP_EXPIRED = """
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then redis.call('ZREM', KEYS[1], ARGV[i - 1]) end
end
return 1
"""


def _num(raw: bytes | str | int) -> float:
    return float(raw.decode() if isinstance(raw, bytes) else raw)


def _repr(x: float) -> str:
    return repr(float(x))  # round-trips exactly, like %.17g on the Lua side


@translates_errors
class RedisLimits:
    def __init__(self, client: Redis, *, prefix: str = DEFAULT_PREFIX) -> None:
        self._client = client
        self._prefix = prefix
        # register_script does no I/O: it sends EVALSHA, and the script itself on NOSCRIPT.
        self._acquire = client.register_script(ACQUIRE)
        self._settle = client.register_script(SETTLE)
        self._peek = client.register_script(PEEK)
        self._renew = client.register_script(RENEW)

    def _bucket_key(self, key: str) -> str:
        return f"{self._prefix}bucket:{key}"

    def _slot_key(self, key: str) -> str:
        return f"{self._prefix}lease:{key}"

    async def acquire(
        self,
        buckets: Sequence[Bucket],
        slots: Sequence[ConcurrencySlot] = (),
        *,
        lease_id: str = "",
        lease_ttl_s: float = 600.0,
    ) -> Acquisition:
        if slots and not lease_id:
            raise ValueError("acquire with concurrency slots needs a lease_id to release")
        keys = [self._bucket_key(b.key) for b in buckets] + [self._slot_key(s.key) for s in slots]
        args: list[Any] = [len(buckets), len(slots), lease_id, _repr(lease_ttl_s)]
        for b in buckets:
            args += [_repr(b.capacity), _repr(b.refill_per_s), _repr(b.cost)]
        args += [s.limit for s in slots]
        reply = await self._acquire(keys=keys, args=args)
        admitted, refused_bucket, refused_slot, retry, now, *remaining = reply
        return Acquisition(
            is_admitted=bool(admitted),
            remaining=tuple(_num(r) for r in remaining),
            refused_bucket=None if refused_bucket < 0 else int(refused_bucket),
            refused_slot=None if refused_slot < 0 else int(refused_slot),
            retry_after_s=_num(retry) if retry else None,
            now=_num(now),
        )

    async def settle(self, settlements: Sequence[Settlement]) -> None:
        if not settlements:
            return
        keys = [self._bucket_key(s.bucket.key) for s in settlements]
        args: list[str] = []
        for s in settlements:
            args += [_repr(s.bucket.capacity), _repr(s.bucket.refill_per_s), _repr(s.delta)]
        await self._settle(keys=keys, args=args)

    async def release(self, slots: Sequence[ConcurrencySlot], lease_id: str) -> None:
        if not slots:
            return
        async with self._client.pipeline(transaction=False) as pipe:
            for slot in slots:
                pipe.zrem(self._slot_key(slot.key), lease_id)
            await pipe.execute()

    async def renew(
        self, leases: Sequence[tuple[ConcurrencySlot, str]], lease_ttl_s: float
    ) -> None:
        """One script call for every lease of the round, however many slots they span."""
        if not leases:
            return
        by_key: dict[str, list[str]] = {}
        for slot, lease_id in leases:
            by_key.setdefault(self._slot_key(slot.key), []).append(lease_id)
        args: list[Any] = [_repr(lease_ttl_s)]
        for lease_ids in by_key.values():
            args += [len(lease_ids), *lease_ids]
        await self._renew(keys=list(by_key), args=args)

    async def peek(self, buckets: Sequence[Bucket]) -> tuple[float, ...]:
        if not buckets:
            return ()
        keys = [self._bucket_key(b.key) for b in buckets]
        args = [_repr(x) for b in buckets for x in (b.capacity, b.refill_per_s)]
        return tuple(_num(r) for r in await self._peek(keys=keys, args=args))


# KEYS: the namespace hash. ARGV: id, JSON, expected version ('' with has_expected '0': absent).
# Returns 1 when it wrote. Only the stored document's "_version" is read (cjson).
PUT_IF = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[4] == '0' then
  if raw then return 0 end
else
  if not raw then return 0 end
  local ok, doc = pcall(cjson.decode, raw)
  if not ok or type(doc) ~= 'table' or doc['_version'] ~= ARGV[3] then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


@translates_errors
class RedisDocuments:
    """One hash per namespace (field = id, value = JSON), so ``list`` is one HGETALL."""

    def __init__(self, client: Redis, *, prefix: str = DEFAULT_PREFIX) -> None:
        self._client = client
        self._prefix = prefix
        self._put_if = client.register_script(PUT_IF)

    def _key(self, namespace: str) -> str:
        return f"{self._prefix}doc:{namespace}"

    async def put(self, namespace: str, doc_id: str, doc: Mapping[str, Any]) -> None:
        await self._client.hset(self._key(namespace), doc_id, orjson.dumps(doc))

    async def put_if(
        self, namespace: str, doc_id: str, doc: Mapping[str, Any], *, expected: str | None
    ) -> bool:
        args = [doc_id, orjson.dumps(doc), expected or "", "0" if expected is None else "1"]
        return bool(await self._put_if(keys=[self._key(namespace)], args=args))

    async def get(self, namespace: str, doc_id: str) -> dict[str, Any] | None:
        raw = await self._client.hget(self._key(namespace), doc_id)
        return None if raw is None else orjson.loads(raw)

    async def delete(self, namespace: str, doc_id: str) -> bool:
        return bool(await self._client.hdel(self._key(namespace), doc_id))

    async def namespaces(self) -> list[str]:
        """Every namespace holding a document (``titan storage reseal`` walks them): one SCAN
        over this prefix's document hashes."""
        head = self._key("")
        pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in head) + "*"
        found = [key.decode()[len(head) :] async for key in self._client.scan_iter(pattern)]
        return sorted(found)

    async def list(self, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        raw = await self._client.hgetall(self._key(namespace))
        # Sorting the UTF-8 bytes gives the code point order of sorted(str), as SQLite does.
        return [(k.decode(), orjson.loads(raw[k])) for k in sorted(raw)]


@translates_errors
class RedisCounters:
    """One hash per (namespace, id) with HINCRBYFLOAT; ``ttl_s`` is EXPIRE on the hash. A sorted
    set per namespace indexes the ids (all score 0, so ZRANGEBYLEX finds a prefix without KEYS).
    """

    def __init__(self, client: Redis, *, prefix: str = DEFAULT_PREFIX) -> None:
        self._client = client
        self._prefix = prefix
        self._drop_expired = client.register_script(DROP_EXPIRED)

    def _key(self, namespace: str, counter_id: str) -> str:
        return f"{self._prefix}ctr:{namespace}:{counter_id}"

    def _index(self, namespace: str) -> str:
        return f"{self._prefix}ctrs:{namespace}"

    async def increment(
        self,
        namespace: str,
        counter_id: str,
        amounts: Mapping[str, float],
        *,
        ttl_s: float | None = None,
    ) -> None:
        await self.increment_many(namespace, [Increment(counter_id, amounts, ttl_s)])

    async def increment_many(self, namespace: str, increments: Sequence[Increment]) -> None:
        items = [item for item in increments if item.amounts]
        if not items:
            return
        # One MULTI/EXEC round trip for them all, on one connection.
        async with self._client.pipeline(transaction=True) as pipe:
            for item in items:
                key = self._key(namespace, item.counter_id)
                for name, amount in item.amounts.items():
                    pipe.hincrbyfloat(key, name, float(amount))
                if item.ttl_s is not None:
                    pipe.pexpire(key, max(1, math.ceil(item.ttl_s * 1000)))
            pipe.zadd(self._index(namespace), {item.counter_id: 0 for item in items})
            await pipe.execute()

    async def read(self, namespace: str, counter_id: str) -> dict[str, float]:
        raw = await self._client.hgetall(self._key(namespace, counter_id))
        return {k.decode(): _num(v) for k, v in raw.items()}

    async def scan(self, namespace: str, prefix: str = "") -> list[tuple[str, dict[str, float]]]:
        index = self._index(namespace)
        if prefix:
            # 0xFF never occurs in UTF-8, so it sorts after every id that starts with prefix.
            low, high = b"[" + prefix.encode(), b"(" + prefix.encode() + b"\xff"
        else:
            low, high = b"-", b"+"
        ids = [i.decode() for i in await self._client.zrangebylex(index, low, high)]
        if not ids:
            return []
        async with self._client.pipeline(transaction=False) as pipe:
            for counter_id in ids:
                pipe.hgetall(self._key(namespace, counter_id))
            hashes = await pipe.execute()
        found, expired = [], []
        for counter_id, raw in zip(ids, hashes, strict=True):
            if raw:
                found.append((counter_id, {k.decode(): _num(v) for k, v in raw.items()}))
            else:
                expired.append(counter_id)
        if expired:
            keys = [index] + [self._key(namespace, i) for i in expired]
            await self._drop_expired(keys=keys, args=expired)
        return found
