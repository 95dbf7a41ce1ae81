"""Cached answers in one process (``CacheStore``); one event loop owns them, so no method awaits
between reading and changing its state."""

from __future__ import annotations

import heapq
import time
from bisect import bisect_left, bisect_right, insort
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from titan.storage.base import CacheEntry

# The expiry heap keeps stale items (replaced, deleted or evicted entries) until their time comes;
# it is rebuilt when they outnumber the live ones by this factor, so it cannot grow without bound.
HEAP_SLACK = 2


@dataclass
class _Namespace:
    # Least recently used first: get and put move an entry to the end.
    lru: OrderedDict[str, CacheEntry] = field(default_factory=OrderedDict)
    # (created_at, key), sorted: added_since bisects it. Ties order by key, as SQLite and Redis do.
    created: list[tuple[float, str]] = field(default_factory=list)
    # (expires_at, key), a heap: what put sweeps first, without scanning every entry.
    expiries: list[tuple[float, str]] = field(default_factory=list)
    num_bytes: int = 0


class MemoryCache:
    """``now``: wall-clock unix seconds, the clock of entries' expires_at; tests inject one."""

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now
        self._spaces: dict[str, _Namespace] = {}

    def _space(self, namespace: str) -> _Namespace:
        return self._spaces.setdefault(namespace, _Namespace())

    def _remove(self, space: _Namespace, key: str) -> CacheEntry | None:
        entry = space.lru.pop(key, None)
        if entry is None:
            return None
        item = (entry.created_at, key)
        i = bisect_left(space.created, item)
        if i < len(space.created) and space.created[i] == item:
            del space.created[i]
        space.num_bytes -= entry.num_bytes
        return entry  # its expiry heap item goes stale; _sweep and _compact drop it

    def _sweep(self, space: _Namespace, now: float) -> list[str]:
        """Drops the expired entries; returns their keys."""
        expired = []
        while space.expiries and space.expiries[0][0] <= now:
            _, key = heapq.heappop(space.expiries)
            entry = space.lru.get(key)
            # The heap item may be stale: the key was replaced by an entry that lives longer.
            if entry is not None and entry.expires_at <= now:
                self._remove(space, key)
                expired.append(key)
        return expired

    def _compact(self, space: _Namespace) -> None:
        if len(space.expiries) > HEAP_SLACK * len(space.lru) + 64:
            space.expiries = [(e.expires_at, k) for k, e in space.lru.items()]
            heapq.heapify(space.expiries)

    async def get(self, namespace: str, key: str) -> CacheEntry | None:
        space = self._spaces.get(namespace)
        entry = None if space is None else space.lru.get(key)
        if space is None or entry is None:
            return None
        if entry.expires_at <= self._now():
            self._remove(space, key)  # lazy expiry
            return None
        space.lru.move_to_end(key)
        return entry

    async def put(self, namespace: str, entry: CacheEntry, *, max_entries: int) -> list[str]:
        space = self._space(namespace)
        self._remove(space, entry.key)
        space.lru[entry.key] = entry
        insort(space.created, (entry.created_at, entry.key))
        heapq.heappush(space.expiries, (entry.expires_at, entry.key))
        space.num_bytes += entry.num_bytes
        # Expired entries go before live ones, and are reported too: a semantic index that
        # mirrors the store forgets them the same way.
        evicted = self._sweep(space, self._now())
        while len(space.lru) > max_entries:
            key = next(iter(space.lru))
            self._remove(space, key)
            evicted.append(key)
        self._compact(space)
        return evicted

    async def delete(self, namespace: str, key: str) -> bool:
        space = self._spaces.get(namespace)
        entry = None if space is None else self._remove(space, key)
        return entry is not None and entry.expires_at > self._now()

    async def flush(
        self, namespace: str, *, tenant: str | None = None, model: str | None = None
    ) -> int:
        space = self._spaces.get(namespace)
        if space is None:
            return 0
        self._sweep(space, self._now())  # so only live entries are counted
        matching = [
            key
            for key, entry in space.lru.items()
            if (tenant is None or entry.tags.get("tenant") == tenant)
            and (model is None or entry.tags.get("model") == model)
        ]
        for key in matching:
            self._remove(space, key)
        self._compact(space)
        return len(matching)

    async def added_since(
        self, namespace: str, since: float, *, limit: int = 10_000
    ) -> list[CacheEntry]:
        space = self._spaces.get(namespace)
        if space is None:
            return []
        now = self._now()
        found: list[CacheEntry] = []
        start = bisect_right(space.created, since, key=lambda item: item[0])
        for _, key in space.created[start:]:
            if len(found) >= limit:
                break
            entry = space.lru[key]
            if entry.expires_at > now:
                found.append(entry)
        return found

    async def stats(self, namespace: str) -> dict[str, int]:
        space = self._spaces.get(namespace)
        if space is None:
            return {"entries": 0, "bytes": 0}
        self._sweep(space, self._now())
        return {"entries": len(space.lru), "bytes": space.num_bytes}
