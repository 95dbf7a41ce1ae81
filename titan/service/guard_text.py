"""Applying guardrail policies to text: a whole text at once, or a text that arrives in pieces
(one choice of a stream), holding back only the tail that could still become a match."""

from __future__ import annotations

from dataclasses import dataclass, field

from titan.service.guard_detectors import Finding, redact
from titan.service.guard_policies import Policy

# Characters already emitted that a stream keeps as left context: patterns look behind a match
# (word boundaries, "not preceded by a digit") and must see what came before the held tail.
CONTEXT_CHARS = 64


@dataclass
class Outcome:
    """The text to pass on; ``blocked_by``: the policy that stopped it there (block);
    ``hits``: every policy that matched, whatever its action (flag, redact, block)."""

    text: str
    blocked_by: Policy | None = None
    hits: dict[str, Policy] = field(default_factory=dict)
    kinds: dict[str, set[str]] = field(default_factory=dict)


async def scan(
    policies: tuple[Policy, ...], text: str, stage: str, model: str
) -> list[tuple[Policy, Finding]]:
    return [
        (policy, finding)
        for policy in policies
        for finding in await policy.find(text, stage, model)
    ]


def apply(text: str, hits: list[tuple[Policy, Finding]], offset: int = 0) -> Outcome:
    """``text`` with ``hits`` applied (their spans relative to ``text`` after ``offset`` is
    subtracted): cut before the first blocked span, redacted spans replaced, flags noted."""
    shifted = [(p, Finding(f.start - offset, f.end - offset, f.kind)) for p, f in hits]
    blocks = [(p, f) for p, f in shifted if p.action == "block"]
    blocked_by, end = None, len(text)
    if blocks:
        blocked_by, first = min(blocks, key=lambda hit: hit[1].start)
        end = first.start
    outcome = Outcome("", blocked_by)
    for policy, finding in shifted:
        if finding.start <= end or policy is blocked_by:
            outcome.hits[policy.name] = policy
            outcome.kinds.setdefault(policy.name, set()).add(finding.kind)
    redactions = [f for p, f in shifted if p.action == "redact" and f.start < end]
    outcome.text = redact(text[:end], [_clip(f, end) for f in redactions])
    return outcome


def _clip(finding: Finding, end: int) -> Finding:
    return Finding(max(0, finding.start), min(end, finding.end), finding.kind)


class ChoiceScanner:
    """One streamed choice. ``feed`` takes the next piece of text and returns what may go to the
    client now; ``is_final`` flushes everything held back."""

    def __init__(self, policies: tuple[Policy, ...], stage: str, model: str):
        self.policies = policies
        self.stage = stage
        self.model = model
        self._context = ""  # emitted (original) text, the last CONTEXT_CHARS of it
        self._pending = ""  # received, not yet emitted

    async def feed(self, piece: str, *, is_final: bool) -> Outcome:
        window = self._context + self._pending + piece
        offset = len(self._context)
        # Findings wholly inside the context were dealt with when it was emitted.
        hits = [
            (policy, Finding(max(f.start, offset), f.end, f.kind))
            for policy, f in await scan(self.policies, window, self.stage, self.model)
            if f.end > offset
        ]
        cut = len(window) if is_final else self._cut(window, offset, hits)
        ready = [(p, f) for p, f in hits if f.end <= cut]
        outcome = apply(window[offset:cut], ready, offset)
        self._context = window[:cut][-CONTEXT_CHARS:]
        self._pending = window[cut:]
        return outcome

    def _cut(self, window: str, offset: int, hits: list[tuple[Policy, Finding]]) -> int:
        """Where the held-back tail starts: the earliest point from which the text could still
        become a match of some policy; a match that reaches into the tail (or ends at the very
        end, so could still grow) is held back whole."""
        cut = min((policy.hold_from(window) for policy in self.policies), default=len(window))
        cut = max(cut, offset)
        is_moved = True
        while is_moved:
            is_moved = False
            for _, finding in hits:
                if finding.start < cut < finding.end or (
                    finding.end == len(window) and finding.start < cut
                ):
                    cut, is_moved = max(offset, finding.start), True
        return cut
