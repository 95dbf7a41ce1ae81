"""A simulated model server in simulated time: continuous batching over a KV block pool with
prefix caching, each step lasting what titan.planning's step-cost model says.

The scheduler follows vLLM's (and the embedded engine's) rules: running sequences first, in
arrival order, then waiting ones (first come, first served) while the token budget
(``max_num_batched_tokens``), the sequence cap (``max_num_seqs``) and the free blocks allow; a
long prompt is computed in chunks; when a running sequence needs a block and none is free, the
latest running sequence is preempted (its blocks freed, recomputed later, often from the prefix
cache); no waiting sequence is admitted in a step with a preemption. A prefix hit leaves at least
one prompt token to compute. A token exists when the step that computed it ends.

Pure: no asyncio, no clock. ``submit`` and ``advance`` take the time; ``titan.simulate.driver``
calls them on the server's clock, and tests on a fake one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from titan.config.simulation import ModelServerProfile
from titan.planning.step_cost import LinearStepCost, attention_pairs
from titan.simulate.kv_blocks import BlockPool, PromptTokens


class ServerRecorder(Protocol):
    """What the metrics see of a sequence: its first token, each token, its end."""

    def on_admitted(self, sequence: Sequence, num_cached_tokens: int) -> None: ...
    def on_first_token(self, sequence: Sequence) -> None: ...
    def on_tokens(self, num_tokens: int) -> None: ...
    def on_finished(self, sequence: Sequence) -> None: ...


class _NoRecorder:
    def on_admitted(self, sequence: Sequence, num_cached_tokens: int) -> None:
        pass

    def on_first_token(self, sequence: Sequence) -> None:
        pass

    def on_tokens(self, num_tokens: int) -> None:
        pass

    def on_finished(self, sequence: Sequence) -> None:
        pass


class SequenceState(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"  # finished or aborted: it holds no blocks


class Sequence:
    """One request in the server. ``num_tokens``: prompt + generated so far; ``num_computed``
    catches up with it (prefill chunks, prefix hits and decodes alike)."""

    __slots__ = (
        "arrival_s",
        "blocks",
        "finish_s",
        "first_token_s",
        "id",
        "num_cached_tokens",
        "num_computed",
        "num_generated",
        "num_output",
        "num_preemptions",
        "num_tokens",
        "prompt",
        "scheduled_s",
        "state",
    )

    def __init__(self, id_: int, prompt: PromptTokens, num_output: int, arrival_s: float):
        self.id = id_
        self.prompt = prompt
        self.num_output = num_output
        self.arrival_s = arrival_s
        self.num_tokens = prompt.num_tokens
        self.num_computed = 0
        self.num_generated = 0
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at first admission
        self.num_preemptions = 0
        self.blocks: list[int] = []
        self.state = SequenceState.WAITING
        self.scheduled_s = math.nan
        self.first_token_s = math.nan
        self.finish_s = math.nan

    @property
    def is_finished(self) -> bool:
        return self.num_generated >= self.num_output

    @property
    def num_prompt_tokens(self) -> int:
        return self.prompt.num_tokens


@dataclass(frozen=True, slots=True)
class _Step:
    end_s: float
    work: tuple[tuple[Sequence, int, int], ...]  # (sequence, start, tokens to compute)


class RequestTooLong(ValueError):
    """Prompt and answer together exceed the KV cache: it could never run."""


class ModelServer:
    def __init__(self, profile: ModelServerProfile, recorder: ServerRecorder | None = None):
        self.profile = profile
        cost = profile.step_cost
        self.cost = LinearStepCost(cost.fixed_s, cost.per_token_s, cost.per_pair_s, cost.per_seq_s)
        self.pool = BlockPool(profile.num_blocks)
        self.recorder: ServerRecorder = recorder if recorder is not None else _NoRecorder()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._step: _Step | None = None  # the step under way; None: idle
        self._next_id = 0
        self.num_steps = 0
        self.num_preemptions = 0

    @property
    def next_step_end_s(self) -> float | None:
        return self._step.end_s if self._step is not None else None

    # ---- requests -------------------------------------------------------------------------

    def submit(self, prompt: PromptTokens, num_output: int, now_s: float) -> Sequence:
        """Queues a request at ``now_s`` (after running every step that ended by then).
        Raises RequestTooLong when it could never fit in the KV cache."""
        needed = prompt.num_tokens + num_output
        if needed > self.pool.num_blocks * self.profile.block_size:
            raise RequestTooLong(
                f"prompt ({prompt.num_tokens} tokens) and answer ({num_output}) exceed the KV "
                f"cache ({self.profile.kv_cache_tokens} tokens)"
            )
        self.advance(now_s)
        sequence = Sequence(self._next_id, prompt, num_output, now_s)
        self._next_id += 1
        self.waiting.append(sequence)
        if self._step is None:
            self._start_step(now_s)
        return sequence

    def abort(self, sequence: Sequence) -> None:
        """The client left: its blocks go back (a step under way still counts its tokens)."""
        if sequence.state is SequenceState.RUNNING:
            self.running.remove(sequence)
        elif sequence.state is SequenceState.WAITING:
            self.waiting.remove(sequence)
        sequence.state = SequenceState.DONE
        self._release(sequence)

    def advance(self, now_s: float) -> list[Sequence]:
        """Runs every step that ends by ``now_s``, each starting when the last one ended;
        returns the sequences that got tokens."""
        moved: list[Sequence] = []
        while self._step is not None and self._step.end_s <= now_s:
            step = self._step
            moved += self._finish_step(step)
            self._start_step(step.end_s)
        return moved

    # ---- one step -------------------------------------------------------------------------

    def _start_step(self, now_s: float) -> None:
        work = self._schedule(now_s)
        if not work:
            self._step = None
            return
        num_tokens = pairs = context = 0
        for _, start, num_new in work:
            num_tokens += num_new
            pairs += attention_pairs(start, num_new)
            context += start + num_new
        seconds = self.cost.seconds(num_tokens, len(work), pairs, context)
        self._step = _Step(now_s + seconds, tuple(work))
        self.num_steps += 1

    def _schedule(self, now_s: float) -> list[tuple[Sequence, int, int]]:
        budget = self.profile.max_num_batched_tokens
        work: list[tuple[Sequence, int, int]] = []
        has_preempted = False
        for sequence in list(self.running):
            if budget <= 0:
                break
            if sequence.state is not SequenceState.RUNNING:
                continue  # preempted for an earlier one in this loop
            num_new = min(sequence.num_tokens - sequence.num_computed, budget)
            while not self._allocate(sequence, num_new):
                has_preempted = True
                if self._preempt(scheduled={s.id for s, _, _ in work}) is sequence:
                    break
            else:
                work.append((sequence, sequence.num_computed, num_new))
                budget -= num_new
        while (
            self.waiting
            and budget > 0
            and not has_preempted
            and len(self.running) < self.profile.max_num_seqs
        ):
            sequence = self.waiting[0]
            cached = self._cached_prefix(sequence)
            sequence.blocks = cached
            sequence.num_computed = len(cached) * self.profile.block_size
            num_new = min(sequence.num_tokens - sequence.num_computed, budget)
            if not self._allocate(sequence, num_new):
                self._release(sequence)  # the hits go back: nothing ran
                break
            self.waiting.popleft()
            if math.isnan(sequence.scheduled_s):
                sequence.scheduled_s = now_s
                sequence.num_cached_tokens = sequence.num_computed
            self.recorder.on_admitted(sequence, sequence.num_computed)
            sequence.state = SequenceState.RUNNING
            self.running.append(sequence)
            work.append((sequence, sequence.num_computed, num_new))
            budget -= num_new
        return work

    def _cached_prefix(self, sequence: Sequence) -> list[int]:
        if not self.profile.enable_prefix_caching:
            return []
        # At least one token is left to compute: its step samples the next token.
        max_blocks = (sequence.num_tokens - 1) // self.profile.block_size
        return self.pool.cached_prefix(sequence.prompt.block_hashes, max_blocks)

    def _allocate(self, sequence: Sequence, num_new: int) -> bool:
        """Blocks for ``num_new`` more tokens; publishes the prompt blocks they complete."""
        block_size = self.profile.block_size
        end = sequence.num_computed + num_new
        needed = -(-end // block_size) - len(sequence.blocks)
        if needed > 0:
            blocks = self.pool.allocate(needed)
            if blocks is None:
                return False
            sequence.blocks += blocks
        if self.profile.enable_prefix_caching:
            hashes = sequence.prompt.block_hashes
            first = sequence.num_computed // block_size
            # Published when scheduled: the step writes them before anyone can read them.
            for index in range(first, min(end // block_size, len(hashes))):
                self.pool.publish(sequence.blocks[index], hashes[index])
        return True

    def _preempt(self, scheduled: set[int]) -> Sequence:
        victim = next(s for s in reversed(self.running) if s.id not in scheduled)
        self.running.remove(victim)
        self._release(victim)
        victim.state = SequenceState.WAITING
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)  # it goes first when blocks come back
        self.num_preemptions += 1
        return victim

    def _release(self, sequence: Sequence) -> None:
        self.pool.free(sequence.blocks)
        sequence.blocks = []
        sequence.num_computed = 0

    def _finish_step(self, step: _Step) -> list[Sequence]:
        moved: list[Sequence] = []
        num_generated = 0
        for sequence, start, num_new in step.work:
            if sequence.state is not SequenceState.RUNNING:
                continue  # aborted while the step ran
            sequence.num_computed = start + num_new
            if sequence.num_computed < sequence.num_tokens:
                continue  # a prompt chunk: nothing sampled yet
            sequence.num_generated += 1
            sequence.num_tokens += 1
            num_generated += 1
            moved.append(sequence)
            if sequence.num_generated == 1:
                sequence.first_token_s = step.end_s
                self.recorder.on_first_token(sequence)
            if sequence.is_finished:
                sequence.finish_s = step.end_s
                sequence.state = SequenceState.DONE
                self.running.remove(sequence)
                self._release(sequence)
                self.recorder.on_finished(sequence)
        self.recorder.on_tokens(num_generated)
        return moved


def run_until_idle(server: ModelServer, sequences: Seq[Sequence]) -> float:
    """Runs steps until every one of ``sequences`` finished; returns the time then (tests and
    offline use: nothing waits for a clock)."""
    now = math.nan
    while not all(s.is_finished for s in sequences):
        end = server.next_step_end_s
        if end is None:
            raise RuntimeError("the server is idle with unfinished sequences")
        server.advance(end)
        now = end
    return now
