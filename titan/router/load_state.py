"""The latest load a deployment's model server reported, and whether it is still worth believing.

The scraper (service/load_scraper.py) feeds it; routing reads ``current()``, which is None once
the last reading is older than ``stale_after_s``: a server that stopped answering its metrics is
not trusted to be as idle as it last said.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from titan.router.replica_load import Exposition
from titan.router.windows import Clock


@dataclass(frozen=True)
class ReplicaLoad:
    """One reading (None: the server does not report it)."""

    waiting: float | None
    running: float | None
    kv_usage: float | None  # 0..1
    prefix_hit_rate: float | None  # 0..1, over the prompts since the previous scrape
    scraped_at: float  # the clock's time
    # Titan's own requests in flight there when the reading came (None: not known). What the
    # server holds beyond them came from elsewhere: other gateways, other clients.
    own_in_flight: float | None = None


class ReplicaLoadTracker:
    def __init__(self, url: str, *, stale_after_s: float, now: Clock):
        self.url = url
        self.stale_after_s = stale_after_s
        self._now = now
        self._latest: ReplicaLoad | None = None
        self._counters: tuple[float, float] | None = None  # (hits, queries) at the last scrape
        self.num_scrapes = 0
        self.num_failures = 0
        self.last_error: str | None = None
        # Titan's own requests in flight at the server (the deployment sets it): kept with each
        # reading, so a stale reading is not taken for the load Titan itself sent since.
        self.own_in_flight: Callable[[], float] | None = None

    def record(self, exposition: Exposition) -> ReplicaLoad:
        """A successful scrape."""
        previous_rate = self._latest.prefix_hit_rate if self._latest else None
        reading = ReplicaLoad(
            waiting=exposition.waiting,
            running=exposition.running,
            kv_usage=_unit(exposition.kv_usage),
            prefix_hit_rate=_unit(self._hit_rate(exposition, previous_rate)),
            scraped_at=self._now(),
            own_in_flight=None if self.own_in_flight is None else self.own_in_flight(),
        )
        self._latest = reading
        self.num_scrapes += 1
        self.last_error = None
        return reading

    def record_failure(self, error: str) -> bool:
        """A failed scrape; True when it is the first of an outage (worth one log line)."""
        is_new = self.last_error is None
        self.num_failures += 1
        self.last_error = error
        return is_new

    def current(self) -> ReplicaLoad | None:
        """The latest reading, unless it is stale."""
        latest = self._latest
        if latest is None or self._now() - latest.scraped_at > self.stale_after_s:
            return None
        return latest

    def _hit_rate(self, exposition: Exposition, previous: float | None) -> float | None:
        hits, queries = exposition.prefix_hits, exposition.prefix_queries
        if hits is None or queries is None:
            return exposition.prefix_hit_rate
        last, self._counters = self._counters, (hits, queries)
        if last is None or queries < last[1] or hits < last[0]:
            # The first scrape, or the server restarted (counters reset): its lifetime so far.
            return hits / queries if queries > 0 else None
        delta_queries = queries - last[1]
        if delta_queries == 0:
            return previous  # no prompt since: the cache still holds what it held
        return (hits - last[0]) / delta_queries

    def snapshot(self) -> dict[str, Any]:
        """For /stats: the current reading (None when stale or never read) and the scraper's
        health."""
        latest, current = self._latest, self.current()
        return {
            "url": self.url,
            "current": None if current is None else _reading(current),
            "age_s": None if latest is None else round(self._now() - latest.scraped_at, 3),
            "scrapes": self.num_scrapes,
            "failures": self.num_failures,
            "last_error": self.last_error,
        }


def _unit(value: float | None) -> float | None:
    """Clamped to 0..1: a server's rounding (or a percentage misnamed) never leaves the range."""
    return None if value is None else min(max(value, 0.0), 1.0)


def _reading(load: ReplicaLoad) -> dict[str, Any]:
    return {
        "waiting": load.waiting,
        "running": load.running,
        "kv_usage": load.kv_usage,
        "prefix_hit_rate": load.prefix_hit_rate,
    }
