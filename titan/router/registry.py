"""Models and their deployments, and the choices that come before a deployment is picked:
tiered routing (simple requests to a small model), canary splits, and fallback chains."""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from titan.config import HedgeConfig, RoutingConfig, SplitConfig, TierRule
from titan.router.deployment import DeploymentState
from titan.router.policies import choose
from titan.router.retry import HedgeBudget
from titan.router.scoring import ROUTE_HEADER, RouteDecision, RouteScoring
from titan.router.windows import LatencyWindow

CHARS_PER_TOKEN = 4  # tier rules estimate tokens: the gateway has no upstream tokenizers


@dataclass(frozen=True)
class RequestTraits:
    """What routing looks at in a request (computed once by the service)."""

    prompt_chars: int = 0

    @property
    def estimated_prompt_tokens(self) -> int:
        return -(-self.prompt_chars // CHARS_PER_TOKEN)

    last_user_text: str = ""
    session_key: str | None = None  # x-titan-session header or the `user` field
    prefix_key: str | None = None  # the prompt's first characters
    # The whole prompt, each message behind its role (the scoring router's prefix blocks).
    prompt_text: str = ""
    # The last user message's unit-length embedding, when a tier rule classifies by similarity.
    embedding: tuple[float, ...] | None = None
    is_batch: bool = False  # the batch priority class (jobs): routed to the batch pool


@dataclass
class RoutedModel:
    name: str
    deployments: list[DeploymentState]
    routing: RoutingConfig
    fallbacks: list[str] = field(default_factory=list)
    splits: list[SplitConfig] = field(default_factory=list)
    tiers: list[TierRule] = field(default_factory=list)
    hedge_budget: HedgeBudget = field(default_factory=lambda: HedgeBudget(HedgeConfig()))
    ttfb: LatencyWindow = field(default_factory=LatencyWindow)  # successes, for the hedge delay
    num_requests: int = 0
    num_fallbacks: int = 0  # requests this model served for another one
    # Per tier rule, the unit-length embeddings of its similar_to examples (set at start).
    tier_examples: list[list[tuple[float, ...]]] = field(default_factory=list)
    # routing.policy scored: its prefix index and last decisions (None for other policies).
    scoring: RouteScoring | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._patterns = [re.compile(t.pattern) if t.pattern else None for t in self.tiers]
        if self.routing.policy == "scored":
            self.scoring = RouteScoring(self.routing.scored, self.deployments)

    @property
    def classifies_by_similarity(self) -> bool:
        return any(rule.similar_to for rule in self.tiers)

    def tier_target(self, traits: RequestTraits) -> str | None:
        for index, (rule, pattern) in enumerate(zip(self.tiers, self._patterns, strict=True)):
            max_tokens = rule.max_prompt_tokens
            if max_tokens is not None and traits.estimated_prompt_tokens <= max_tokens:
                return rule.model
            if pattern is not None and pattern.search(traits.last_user_text):
                return rule.model
            if rule.similar_to and traits.embedding is not None and self.tier_examples:
                best = max(_dot(traits.embedding, e) for e in self.tier_examples[index])
                if best >= rule.min_similarity:
                    return rule.model
        return None

    def route_headers(self, winner: str, decisions: list[RouteDecision]) -> dict[str, str]:
        """The debug header explaining why ``winner`` was picked (only when asked for)."""
        if self.scoring is None or not self.routing.scored.debug_header:
            return {}
        decision = next((d for d in reversed(decisions) if d.chosen == winner), None)
        return {} if decision is None else {ROUTE_HEADER: decision.header()}

    def affinity_key(self, traits: RequestTraits) -> str | None:
        if self.routing.policy == "session_affinity":
            return traits.session_key
        if self.routing.policy == "prefix_affinity":
            return traits.prefix_key
        return None


def _dot(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    """The cosine of two unit vectors."""
    return sum(x * y for x, y in zip(a, b, strict=True))


class Registry:
    def __init__(self, models: Iterable[RoutedModel], rng: random.Random | None = None):
        self.models = {model.name: model for model in models}
        self.rng = rng or random.Random()

    def resolve(self, name: str, traits: RequestTraits) -> RoutedModel | None:
        """The model that serves a request for ``name``: its tier rule's target if one matches,
        then (once) a canary split by weight."""
        model = self.models.get(name)
        if model is None:
            return None
        target = model.tier_target(traits)
        if target is not None:
            model = self.models[target]
        if model.splits:
            draw = self.rng.random()
            for split in model.splits:
                if draw < split.weight:
                    return self.models[split.model]
                draw -= split.weight
        return model

    def chain(self, model: RoutedModel) -> list[RoutedModel]:
        """The model, then its fallbacks (theirs too, depth first), each once."""
        order: list[RoutedModel] = []
        pending = [model.name]
        while pending:
            name = pending.pop(0)
            if name in (m.name for m in order):
                continue
            current = self.models[name]
            order.append(current)
            pending = current.fallbacks + pending
        return order

    def has_untried(self, model: RoutedModel, tried: set[str]) -> bool:
        """Whether an available deployment of ``model`` is not in ``tried`` (changes nothing,
        unlike ``pick``, whose round robin advances)."""
        return any(d.name not in tried and d.is_available for d in model.deployments)

    def pick(
        self,
        model: RoutedModel,
        traits: RequestTraits,
        exclude: set[str],
        decisions: list[RouteDecision] | None = None,
    ) -> DeploymentState | None:
        """An available deployment of ``model`` not in ``exclude`` (already tried), or None.
        A scored model's decision (every candidate's scores) is appended to ``decisions``."""
        candidates = [d for d in model.deployments if d.name not in exclude and d.is_available]
        candidates = _in_pool(candidates, traits.is_batch)
        if not candidates:
            return None
        if model.scoring is not None:
            unavailable = [
                d for d in model.deployments if d.name not in exclude and not d.is_available
            ]
            chosen, decision = model.scoring.choose(
                candidates,
                unavailable,
                traits.prompt_text,
                traits.estimated_prompt_tokens,
                self.rng,
            )
            if decisions is not None:
                decisions.append(decision)
            return chosen
        return choose(candidates, model.routing, self.rng, affinity_key=model.affinity_key(traits))


def _in_pool(candidates: list[DeploymentState], is_batch: bool) -> list[DeploymentState]:
    """The deployments of the request's pool: batch requests go to batch deployments, else
    shared ones, never interactive ones; other requests to interactive and shared ones, else
    (all down) to batch ones."""
    if is_batch:
        return [d for d in candidates if d.pool == "batch"] or [
            d for d in candidates if d.pool == "shared"
        ]
    return [d for d in candidates if d.pool != "batch"] or candidates
