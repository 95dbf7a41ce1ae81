"""Usage accounting: requests, tokens and cost per key, tenant and overall, in a CounterStore.

Every ``record`` increments one counter per (scope, granularity, period, model), with ids
``{scope}|{granularity}|{period}|{model}`` in namespace ``usage``:

- scope: ``key:{key_id}``, ``tenant:{tenant}`` and always ``all``;
- granularity and period (UTC): ``hour`` ``2026-11-29T17``, ``day`` ``2026-11-29``, ``month``
  ``2026-11``, ``total`` ``all``. These labels sort in time order, so period ranges compare as
  strings;
- model: the model's name, and ``*`` for the aggregate over the scope's models, which budgets
  read with one ``read`` instead of a scan.

Hour counters expire after 8 days and day counters after 400 (enough for a week's and a year's
reports); month and total counters are kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from titan.config.admission import Price
from titan.errors import InvalidRequestError
from titan.storage.base import CounterStore, Increment

NAMESPACE = "usage"
ALL_SCOPE = "all"
ALL_MODELS = "*"
FIELDS = ("requests", "prompt_tokens", "completion_tokens", "cost_usd")

Granularity = Literal["hour", "day", "month", "total"]
GRANULARITIES: tuple[Granularity, ...] = ("hour", "day", "month", "total")
_FORMATS: dict[Granularity, str] = {"hour": "%Y-%m-%dT%H", "day": "%Y-%m-%d", "month": "%Y-%m"}
_DAY_S = 86_400.0
_TTL_S: dict[Granularity, float | None] = {
    "hour": 8 * _DAY_S,
    "day": 400 * _DAY_S,
    "month": None,
    "total": None,
}


def period_of(granularity: Granularity, timestamp: float) -> str:
    """The UTC period label holding ``timestamp``: ``2026-11-29T17``, ``2026-11-29``,
    ``2026-11``, or ``all`` for ``total``."""
    if granularity == "total":
        return "all"
    return datetime.fromtimestamp(timestamp, UTC).strftime(_FORMATS[granularity])


def cost_usd(price: Price | None, prompt_tokens: int, completion_tokens: int) -> float:
    """What the tokens cost at ``price`` (USD per million tokens); 0 without a price."""
    if price is None:
        return 0.0
    return (
        prompt_tokens * price.prompt_per_1m + completion_tokens * price.completion_per_1m
    ) / 1_000_000


def _checked_scope_part(value: str, what: str) -> str:
    # '|' separates the parts of a counter id; the model is last, so only it may contain one.
    if not value or "|" in value:
        raise InvalidRequestError(f"invalid {what} {value!r} for usage accounting", param=what)
    return value


@dataclass(frozen=True)
class Usage:
    """What some requests of one key (or none), tenant and model used."""

    key_id: str | None
    tenant: str | None
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    requests: int = 1

    def amounts(self) -> dict[str, float]:
        return {
            "requests": float(self.requests),
            "prompt_tokens": float(self.prompt_tokens),
            "completion_tokens": float(self.completion_tokens),
            "cost_usd": float(self.cost_usd),
        }


class UsageLedger:
    """Records and reports usage in ``counters``; ``now`` (unix seconds) picks the periods."""

    def __init__(self, counters: CounterStore, *, now: Callable[[], float] = time.time) -> None:
        self._counters = counters
        self._now = now

    async def record(
        self,
        *,
        key_id: str | None,
        tenant: str | None,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        cost_usd: float,
    ) -> None:
        """Count one request now in every scope it belongs to, at every granularity, for its
        model and for ``*``."""
        usage = Usage(key_id, tenant, model, prompt_tokens, completion_tokens, cost_usd)
        await self.record_many([(self._now(), usage)])

    async def record_many(self, entries: Sequence[tuple[float, Usage]]) -> None:
        """Count each (unix time, usage) in one round trip to the store. The increments of one
        call are written together; a failure leaves them all uncounted or all counted where the
        store has transactions (SQLite, Redis)."""
        increments = []
        for at, usage in entries:
            scopes = [ALL_SCOPE]
            if usage.key_id is not None:
                scopes.append(f"key:{_checked_scope_part(usage.key_id, 'key_id')}")
            if usage.tenant is not None:
                scopes.append(f"tenant:{_checked_scope_part(usage.tenant, 'tenant')}")
            amounts = usage.amounts()
            for granularity in GRANULARITIES:
                period = period_of(granularity, at)
                for scope in scopes:
                    for counted_model in (usage.model, ALL_MODELS):
                        counter_id = f"{scope}|{granularity}|{period}|{counted_model}"
                        increments.append(Increment(counter_id, amounts, _TTL_S[granularity]))
        if increments:
            await self._counters.increment_many(NAMESPACE, increments)

    async def spent_usd(self, scope: str, period: Literal["day", "month", "total"]) -> float:
        """USD spent by ``scope`` (``key:…``, ``tenant:…`` or ``all``) in the current UTC day or
        month, or ever: what budgets compare against."""
        counter_id = f"{scope}|{period}|{period_of(period, self._now())}|{ALL_MODELS}"
        return float((await self._counters.read(NAMESPACE, counter_id)).get("cost_usd", 0.0))

    async def report(
        self,
        scope: str | None,
        granularity: Granularity,
        start: float | None = None,
        end: float | None = None,
    ) -> list[dict[str, object]]:
        """Per-model usage rows ``{scope, period, model, requests, prompt_tokens,
        completion_tokens, cost_usd}``, sorted by scope, period and model.

        ``scope``: one scope (``key:…``, ``tenant:…`` or ``all``), or None for every key and
        tenant scope. None leaves out ``all`` (ask for it by name): it repeats the key and tenant
        rows summed, plus requests made without a key. Rows of different scopes overlap (a key's
        requests are also its tenant's), so sum within one scope only.

        ``start``/``end`` (unix seconds, inclusive, each optional): only periods holding some
        instant of that range; the ``total`` period holds every instant.
        """
        prefixes = [f"{scope}|"] if scope is not None else ["key:", "tenant:"]
        is_ranged = granularity != "total"
        first = period_of(granularity, start) if start is not None and is_ranged else None
        last = period_of(granularity, end) if end is not None and is_ranged else None
        rows: list[dict[str, object]] = []
        for prefix in prefixes:
            for counter_id, fields in await self._counters.scan(NAMESPACE, prefix):
                parts = counter_id.split("|", 3)
                if len(parts) != 4:
                    continue  # not a counter this ledger wrote
                row_scope, row_granularity, period, model = parts
                if row_granularity != granularity or model == ALL_MODELS:
                    continue
                if (first is not None and period < first) or (last is not None and period > last):
                    continue
                rows.append(
                    {
                        "scope": row_scope,
                        "period": period,
                        "model": model,
                        "requests": int(fields.get("requests", 0)),
                        "prompt_tokens": int(fields.get("prompt_tokens", 0)),
                        "completion_tokens": int(fields.get("completion_tokens", 0)),
                        "cost_usd": float(fields.get("cost_usd", 0.0)),
                    }
                )
        rows.sort(key=lambda row: (str(row["scope"]), str(row["period"]), str(row["model"])))
        return rows
