"""The semantic cache's error budget: serve a near question's answer only where verifications
show that, at that similarity, at most ``max_error_rate`` of such answers are wrong.

A fixed similarity threshold cannot be right for every region of the embedding space or every
kind of traffic (vCache, "Verified Semantic Prompt Caching", ICLR 2026). Here the threshold is
learned online from verifications: a would-be semantic hit that is not served runs the model, and
the fresh answer is compared with the cached one (``VerifiedAnswers``). Each outcome is a record
(similarity, right or wrong).

- Per entry, as vCache does: an entry is eligible at similarity ``s`` once ``min_verifications``
  verifications agreed with it and none failed at ``s`` or above (one that failed at ``s`` is
  eligible only above ``s``).
- Per model, the acceptance threshold is the lowest similarity ``t`` (from the configured floor
  up) at which the verified eligible decisions with similarity ≥ ``t`` bound the error rate, at
  95% confidence (Wilson's score interval, one-sided), by ``max_error_rate``: the records
  measure the policy that serves (eligible and ≥ ``t``), not the first sight of each entry.
  Until they prove it, nothing is served: a cold cache errs on the side of a miss.
- Served hits keep being sampled (``verify_fraction`` of them run the model anyway), so that the
  estimate follows the traffic; would-be hits below the threshold are misses anyway, and their
  verification costs no extra model call.

The bound is on the share of wrong answers among the semantic hits served (a stricter measure
than vCache's share among all requests), on traffic like the traffic verified so far. The state
is this replica's, in memory: replicas learn apart, each errs on the side of a miss until it has
seen enough.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

# One-sided 95%: the normal quantile of Wilson's score bound.
Z = 1.6449
# Candidate thresholds are this far apart, from the floor to 1.
STEP = 0.005
# Records kept per model: enough for a bound of 1% (the rule of three needs ~300 right answers
# in a row), bounded in memory.
MAX_RECORDS = 20_000
RELEARN_EVERY = 16
# Entries whose state is kept per model (least recently verified go first).
MAX_ENTRIES = 100_000

Action = Literal["serve", "verify", "miss"]


@dataclass(frozen=True)
class Decision:
    action: Action
    # The entry's own history allows serving at this similarity: the outcome of such a
    # decision measures the policy's error (the first verifications of an entry do not).
    is_eligible: bool = False


def upper_bounds(errors: np.ndarray, trials: np.ndarray) -> np.ndarray:
    """Wilson's one-sided 95% upper limit of error rates seen as errors / trials (1 where
    nothing was seen). With no error it is about 2.7 / trials: ~270 right answers in a row
    bound the rate by 1%."""
    n = np.maximum(trials, 1).astype(np.float64)
    rate = errors / n
    centre = rate + Z * Z / (2 * n)
    spread = Z * np.sqrt(rate * (1 - rate) / n + Z * Z / (4 * n * n))
    return np.where(trials > 0, np.minimum(1.0, (centre + spread) / (1 + Z * Z / n)), 1.0)


def upper_bound(errors: int, trials: int) -> float:
    return float(upper_bounds(np.array([errors]), np.array([trials]))[0])


@dataclass
class EntryRecord:
    right: int = 0  # verifications whose answers agreed
    failed_at: float = -math.inf  # the highest similarity at which a verification disagreed


@dataclass
class Estimate:
    """What the records say at the current threshold, for /admin/cache and /metrics."""

    threshold: float | None  # None: not enough evidence yet, nothing is served
    verified: int  # records at or above the threshold (all records when there is none)
    errors: int
    error_rate: float
    upper_bound: float


@dataclass
class ModelBudget:
    """The records, the learned threshold and the per-entry state of one model."""

    floor: float
    max_error_rate: float
    records: deque[tuple[float, bool]] = field(default_factory=lambda: deque(maxlen=MAX_RECORDS))
    entries: dict[str, EntryRecord] = field(default_factory=dict)
    threshold: float | None = None
    # Counters for the cost report.
    lookups: int = 0
    served: int = 0
    verifications: int = 0
    extra_calls: int = 0  # verifications of hits that would otherwise have been served
    recorded: int = 0

    def learn(self) -> None:
        """The lowest candidate threshold whose records bound the error rate by the budget:
        the hits served from it on are within budget together, whatever lies above it."""
        self.threshold = None
        if not self.records:
            return
        records = np.array(self.records, dtype=np.float64)
        descending = np.sort(records[:, 0])[::-1]
        wrong = (records[np.argsort(-records[:, 0], kind="stable"), 1] == 0).cumsum()
        candidates = np.arange(1.0, self.floor - 1e-9, -STEP)
        # Records at or above each candidate: a prefix of the descending similarities.
        counts = np.searchsorted(-descending, -candidates, side="right")
        errors = np.where(counts > 0, wrong[np.maximum(counts - 1, 0)], 0)
        within = (counts > 0) & (upper_bounds(errors, counts) <= self.max_error_rate)
        if within.any():
            self.threshold = round(float(candidates[np.flatnonzero(within)[-1]]), 4)

    def estimate(self) -> Estimate:
        chosen = self.threshold
        records = [ok for sim, ok in self.records if chosen is None or sim >= chosen]
        errors = sum(not ok for ok in records)
        rate = errors / len(records) if records else 0.0
        return Estimate(chosen, len(records), errors, rate, upper_bound(errors, len(records)))


class ErrorBudget:
    """Decides, for each would-be semantic hit (similar enough and passing the guards), whether
    to serve it, verify it (run the model and compare) or miss; learns from the outcomes."""

    def __init__(self, rng: random.Random | None = None):
        self._rng = rng or random.Random()
        self._models: dict[str, ModelBudget] = {}

    def model(self, name: str, *, floor: float, max_error_rate: float) -> ModelBudget:
        """The model's state; a changed floor or budget starts it afresh."""
        budget = self._models.get(name)
        if budget is None or (budget.floor, budget.max_error_rate) != (floor, max_error_rate):
            budget = ModelBudget(floor, max_error_rate)
            self._models[name] = budget
        return budget

    def decide(
        self,
        budget: ModelBudget,
        key: str,
        similarity: float,
        *,
        verify_fraction: float,
        min_verifications: int,
    ) -> Decision:
        budget.lookups += 1
        if similarity < budget.floor:
            return Decision("miss")
        entry = budget.entries.get(key) or EntryRecord()
        is_eligible = entry.right >= min_verifications and similarity > entry.failed_at
        above = budget.threshold is not None and similarity >= budget.threshold
        if not (is_eligible and above) or self._rng.random() < verify_fraction:
            budget.verifications += 1
            budget.extra_calls += is_eligible and above  # else the model runs anyway
            return Decision("verify", is_eligible)
        budget.served += 1
        return Decision("serve", is_eligible)

    def record(
        self,
        budget: ModelBudget,
        key: str,
        similarity: float,
        is_right: bool,
        is_eligible: bool,
    ) -> None:
        """The outcome of one verification: the entry's history always; the model's records
        (what the threshold is learned from) when the entry could have been served then."""
        if is_eligible:
            budget.records.append((similarity, is_right))
        entry = budget.entries.pop(key, None) or EntryRecord()
        budget.entries[key] = entry  # most recently verified last: the oldest go first
        if is_right:
            entry.right += 1
        else:
            entry.failed_at = max(entry.failed_at, similarity)
        if len(budget.entries) > MAX_ENTRIES:
            del budget.entries[next(iter(budget.entries))]
        # A wrong answer is learned from at once; right ones only lower the threshold, so they
        # may wait: past the first records, every RELEARN_EVERY-th (learning sorts them all).
        if not is_eligible:
            return
        budget.recorded += 1
        if not is_right or budget.recorded < 1000 or budget.recorded % RELEARN_EVERY == 0:
            budget.learn()

    def forget(self, key: str) -> None:
        for budget in self._models.values():
            budget.entries.pop(key, None)

    def report(self) -> dict[str, dict[str, object]]:
        """Per model: the learned threshold, the estimated error rate of served hits with its
        95% upper bound, and the verification cost."""
        out: dict[str, dict[str, object]] = {}
        for name, budget in self._models.items():
            estimate = budget.estimate()
            out[name] = {
                "max_error_rate": budget.max_error_rate,
                "threshold": estimate.threshold,
                "estimated_error_rate": round(estimate.error_rate, 5),
                "error_rate_upper_bound": round(estimate.upper_bound, 5),
                "verified": estimate.verified,
                "would_be_hits": budget.lookups,
                "served": budget.served,
                "verifications": budget.verifications,
                "extra_model_calls": budget.extra_calls,
                "extra_calls_per_1000": round(1000 * budget.extra_calls / budget.lookups, 2)
                if budget.lookups
                else 0.0,
            }
        return out
