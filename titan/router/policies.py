"""Load-balancing policies: which available deployment takes the next attempt.

Each policy is a pure function of the candidates' live state (and a seeded random source), so
tests pin every decision.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence

from titan.config import RoutingConfig
from titan.router.deployment import DeploymentState

# Latency assumed for a deployment with no measurement yet: optimistic, so it gets tried.
UNMEASURED_LATENCY_S = 0.001


def choose(
    candidates: Sequence[DeploymentState],
    config: RoutingConfig,
    rng: random.Random,
    *,
    affinity_key: str | None = None,
) -> DeploymentState:
    """``candidates`` are available and not yet tried by this request (non-empty).

    ``affinity_key``: the session (session_affinity) or the prompt prefix (prefix_affinity).
    """
    if len(candidates) == 1:
        return candidates[0]
    policy = config.policy
    if policy == "round_robin":
        return smooth_weighted_round_robin(candidates)
    if policy == "least_outstanding":
        return least_outstanding(candidates, rng)
    if policy == "session_affinity" and affinity_key is not None:
        return rendezvous(candidates, affinity_key)
    if policy == "prefix_affinity" and affinity_key is not None:
        chosen = rendezvous(candidates, affinity_key)
        least = min(d.outstanding for d in candidates)
        # Affinity helps only while it does not pile work on one replica.
        if chosen.outstanding > config.imbalance_factor * (least + 1):
            return least_outstanding(candidates, rng)
        return chosen
    return power_of_two_choices(candidates, rng)


def _score(deployment: DeploymentState) -> float:
    """Expected wait: queued work times latency, per unit of weight."""
    latency = deployment.latency.value or UNMEASURED_LATENCY_S
    return (deployment.outstanding + 1) * latency / deployment.weight


def power_of_two_choices(
    candidates: Sequence[DeploymentState], rng: random.Random
) -> DeploymentState:
    """Two candidates drawn by weight, the one with the lower expected wait wins: near-optimal
    balance without every request herding onto the momentarily best replica."""
    weights = [d.weight for d in candidates]
    first = rng.choices(range(len(candidates)), weights=weights)[0]
    rest = [i for i in range(len(candidates)) if i != first]
    second = rng.choices(rest, weights=[weights[i] for i in rest])[0]
    a, b = candidates[first], candidates[second]
    return a if _score(a) <= _score(b) else b


def least_outstanding(candidates: Sequence[DeploymentState], rng: random.Random) -> DeploymentState:
    best = min(d.outstanding / d.weight for d in candidates)
    return rng.choice([d for d in candidates if d.outstanding / d.weight == best])


def smooth_weighted_round_robin(candidates: Sequence[DeploymentState]) -> DeploymentState:
    """nginx's smooth weighted round robin: weights 5:1:1 give a a b a c a a, not a a a a a b c."""
    total = sum(d.weight for d in candidates)
    for deployment in candidates:
        deployment.round_robin_weight += deployment.weight
    chosen = max(candidates, key=lambda d: d.round_robin_weight)
    chosen.round_robin_weight -= total
    return chosen


def rendezvous(candidates: Sequence[DeploymentState], key: str) -> DeploymentState:
    """Highest-random-weight hashing: a key keeps its deployment while that one is available, and
    only the keys of a deployment that leaves move."""

    def score(deployment: DeploymentState) -> float:
        digest = hashlib.blake2b(f"{key}\x00{deployment.name}".encode(), digest_size=8).digest()
        unit = (int.from_bytes(digest, "big") + 1) / (2**64 + 2)  # strictly inside (0, 1)
        return -deployment.weight / math.log(unit)  # weighted: Resendez & Thaler's rule

    return max(candidates, key=score)
