"""The routing benchmark's three seeded workloads (issue 24), as load generator workloads:

- ``tenants``: each tenant has a long system prompt of its own (~2,000 tokens); requests are short
  questions from random tenants, so a replica that served a tenant holds most of its next prompt;
- ``conversations``: multi-turn chats, each turn's prompt the conversation so far (the earlier
  answers written in, as a client keeps them) plus a new question; turns of different
  conversations interleave, so each turn's prefix is the previous turn's prompt;
- ``unique``: prompts that share nothing (only the question template), where no routing can win
  through a cache and nothing must be lost.

Token counts are approximate (about 4 characters a token, the simulator's own rule).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from titan.loadgen.workloads import Workload

CHARS_PER_TOKEN = 4
WORKLOADS = ("tenants", "conversations", "unique")

_WORDS = (
    "ledger", "harbour", "invoice", "turbine", "orchard", "protocol", "glacier", "lantern",
    "quarry", "meridian", "canopy", "cipher", "furnace", "estuary", "pavilion", "sextant",
    "bramble", "citadel", "dynamo", "equinox", "fjord", "gazette", "hinterland", "isotope",
)  # fmt: skip


@dataclass(frozen=True)
class WorkloadShape:
    num_tenants: int = 50
    system_tokens: int = 2_000
    num_conversations: int = 200
    turns: int = 10
    turn_tokens: int = 60
    answer_tokens: int = 40
    unique_tokens: int = 400
    max_tokens: int = 16


def _text(rng: random.Random, num_tokens: int) -> str:
    words: list[str] = []
    while len(" ".join(words)) < num_tokens * CHARS_PER_TOKEN:
        words.append(f"{rng.choice(_WORDS)}-{rng.randrange(10_000)}")
    return " ".join(words)


def _body(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip


def tenants(shape: WorkloadShape, seed: int, num_requests: int) -> Workload:
    rng = random.Random(seed)
    systems = [_text(rng, shape.system_tokens) for _ in range(shape.num_tenants)]
    bodies = [
        _body(
            [
                {"role": "system", "content": f"Tenant {tenant}. {systems[tenant]}"},
                {"role": "user", "content": f"Question {index}: {_text(rng, 20)}?"},
            ],
            shape.max_tokens,
        )
        for index in range(num_requests)
        for tenant in [rng.randrange(shape.num_tenants)]
    ]
    return Workload("tenants", tuple(bodies))


def conversations(shape: WorkloadShape, seed: int, num_requests: int) -> Workload:
    """``num_conversations`` live at a time, each of ``turns`` turns; when one ends a new one
    takes its place. Every round visits each live conversation once, in a fresh order, so a
    conversation's next turn comes about ``num_conversations`` requests after its previous one.

    Stationary: the conversations live at the start are already at turns 1..``turns`` (their
    earlier turns written into the history, never sent: Titan met them mid-way), so every part
    of the stream mixes all turns alike. Were they all to start at turn 1, a sweep's later rates
    would carry longer prompts than its earlier ones, and its last ones, past the end of the
    conversations, repeats of prompts already cached."""
    rng = random.Random(seed)
    started = 0

    def start(turns_done: int) -> list[dict[str, str]]:
        nonlocal started
        history = [{"role": "system", "content": f"Assistant for customer {started}."}]
        started += 1
        for _ in range(turns_done):
            history.append({"role": "user", "content": _text(rng, shape.turn_tokens) + "?"})
            history.append({"role": "assistant", "content": _text(rng, shape.answer_tokens)})
        return history

    live = [start(slot % shape.turns) for slot in range(shape.num_conversations)]
    bodies: list[dict[str, Any]] = []
    while len(bodies) < num_requests:
        # A fresh order each round: in a fixed one, round robin over N replicas sends every turn
        # of a conversation to the same replica whenever N divides the number of conversations.
        for slot in rng.sample(range(len(live)), len(live)):
            history = live[slot]
            history.append({"role": "user", "content": _text(rng, shape.turn_tokens) + "?"})
            bodies.append(_body(list(history), shape.max_tokens))
            history.append({"role": "assistant", "content": _text(rng, shape.answer_tokens)})
            if len(history) >= 1 + 2 * shape.turns:  # its last turn: a new one takes the slot
                live[slot] = start(0)
    return Workload("conversations", tuple(bodies[:num_requests]))


def unique(shape: WorkloadShape, seed: int, num_requests: int) -> Workload:
    """As many prompts as asked for, none sharing a prefix with another (never a repeat)."""
    rng = random.Random(seed)
    bodies = [
        _body(
            [{"role": "user", "content": f"{_text(rng, shape.unique_tokens)}?"}], shape.max_tokens
        )
        for _ in range(num_requests)
    ]
    return Workload("unique", tuple(bodies))


def build(name: str, shape: WorkloadShape, seed: int, num_requests: int) -> Workload:
    if name == "tenants":
        return tenants(shape, seed, num_requests)
    if name == "conversations":
        return conversations(shape, seed, num_requests)
    if name == "unique":
        return unique(shape, seed, num_requests)
    raise ValueError(f"no workload {name!r}: one of {', '.join(WORKLOADS)}")
