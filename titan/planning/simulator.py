"""A discrete-event simulation of continuous batching, step by step as the embedded engine runs.

Events are arrivals and step ends. The engine's loop takes the requests that arrived while a
step ran, schedules the next step, runs it for ``cost.seconds(...)`` and advances every scheduled
request; when idle it waits for the next arrival. The scheduler is the engine's
(titan/engine/scheduler.py), rule for rule: running requests first in arrival order, then
waiting ones (FCFS) while the token budget and the sequence cap allow; a prompt longer than the
budget is computed in chunks; while decodes run, a prefill chunk may be limited so the step is
at most ``max_decode_slowdown`` × the decodes alone; when KV blocks run out, the least computed,
latest running request is preempted and recomputed later; waiting requests are admitted only in
steps without a preemption. A request's first token exists when the step that computed its
last prompt token ends.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from titan.planning.step_cost import StepCost, attention_pairs, max_chunk_by_search
from titan.planning.traffic import TraceRequest


class ChunkModel(Protocol):
    def max_prefill_tokens(
        self, start: int, num_decodes: int, num_decode_pairs: int, max_slowdown: float
    ) -> int | None: ...


@dataclass(frozen=True)
class SchedulerSpec:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: KV never runs out
    # The embedded engine's chunk rule (None: the token budget only, as vLLM does).
    max_decode_slowdown: float | None = None
    max_prefill_chunk_while_decoding: int | None = None
    min_prefill_chunk: int = 16
    shared_prefix_tokens: int = 0  # served from the prefix cache once computed (whole blocks)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"need 1 <= max_num_seqs ({self.max_num_seqs}) <= max_num_batched_tokens "
                f"({self.max_num_batched_tokens})"
            )


class _Request:
    __slots__ = (
        "arrival_s",
        "cached_blocks",
        "finish_s",
        "first_token_s",
        "index",
        "num_blocks",
        "num_computed",
        "num_generated",
        "num_output",
        "num_prompt",
        "num_tokens",
        "start_s",
    )

    def __init__(self, index: int, trace: TraceRequest):
        self.index = index
        self.arrival_s = trace.arrival_s
        self.num_prompt = trace.num_prompt_tokens
        self.num_output = trace.num_output_tokens
        self.num_tokens = trace.num_prompt_tokens  # prompt + tokens generated so far
        self.num_computed = 0
        self.num_generated = 0
        self.num_blocks = 0  # its own blocks (the shared prefix's are counted once, apart)
        self.cached_blocks = 0
        self.start_s = math.nan  # first admission
        self.first_token_s = math.nan
        self.finish_s = math.nan


@dataclass
class SimResult:
    """Per request (trace order): seconds from arrival to first token, to admission, to the
    last token, and the mean gap between output tokens (nan for one-token outputs)."""

    ttft_s: list[float]
    queue_s: list[float]
    e2e_s: list[float]
    tpot_s: list[float]
    arrival_s: list[float]
    num_output_tokens: list[int]
    num_steps: int = 0
    busy_s: float = 0.0
    num_preemptions: int = 0
    step_seqs: list[int] = field(default_factory=list)  # per step: sequences, tokens
    step_tokens: list[int] = field(default_factory=list)
    waiting_at_arrival: list[int] = field(default_factory=list)
    end_s: float = 0.0


class _Engine:
    def __init__(self, spec: SchedulerSpec, cost: StepCost, chunk_model: ChunkModel | None):
        self.spec, self.cost, self.chunk_model = spec, cost, chunk_model
        self.running: list[_Request] = []
        self.waiting: deque[_Request] = deque()
        self.requeued: list[_Request] = []  # preempted: older than every waiting arrival
        bs = spec.block_size
        self.shared_blocks = spec.shared_prefix_tokens // bs
        total = spec.num_kv_blocks if spec.num_kv_blocks is not None else 1 << 62
        self.free_blocks = total - self.shared_blocks
        if self.free_blocks < 1:
            raise ValueError("the KV cache is smaller than the shared prefix")
        self.is_prefix_published = False
        self.num_preemptions = 0

    # ---- blocks -------------------------------------------------------------------------------

    def _allocate(self, request: _Request, start: int, num_new: int) -> bool:
        bs = self.spec.block_size
        needed = -(-(start + num_new) // bs) - request.cached_blocks - request.num_blocks
        if needed > self.free_blocks:
            return False
        if needed > 0:
            self.free_blocks -= needed
            request.num_blocks += needed
        if start + num_new >= self.shared_blocks * bs:
            self.is_prefix_published = True
        return True

    def _free(self, request: _Request) -> None:
        self.free_blocks += request.num_blocks
        request.num_blocks = 0

    # ---- one step -----------------------------------------------------------------------------

    def _chunk(
        self, request: _Request, start: int, budget: int, decode_load: tuple[int, int]
    ) -> int:
        remaining = request.num_tokens - start
        num_new = min(remaining, budget)
        num_decodes, num_decode_pairs = decode_load
        if remaining == 1 or not num_decodes:
            return num_new
        limit = self.spec.max_prefill_chunk_while_decoding
        slowdown = self.spec.max_decode_slowdown
        if slowdown is not None:
            if self.chunk_model is not None:
                fitted = self.chunk_model.max_prefill_tokens(
                    start, num_decodes, num_decode_pairs, slowdown
                )
            else:
                fitted = max_chunk_by_search(
                    self.cost, start, num_decodes, num_decode_pairs, slowdown, num_new
                )
            limit = fitted if fitted is not None else limit
        if limit is None:
            return num_new
        return min(num_new, max(limit, self.spec.min_prefill_chunk))

    def _preempt_victim(self, scheduled_ids: set[int]) -> _Request:
        candidates = [r for r in self.running if r.index not in scheduled_ids]
        victim = max(candidates, key=lambda r: (-r.num_computed, r.index))
        self.running.remove(victim)
        self._free(victim)
        victim.num_computed = 0
        victim.cached_blocks = 0
        keys = [r.index for r in self.requeued]
        position = sum(1 for key in keys if key < victim.index)
        self.requeued.insert(position, victim)
        self.num_preemptions += 1
        return victim

    def schedule(self, now: float) -> list[tuple[_Request, int, int]]:
        spec = self.spec
        budget = spec.max_num_batched_tokens
        self.running.sort(key=lambda r: r.index)
        scheduled: list[tuple[_Request, int, int]] = []
        scheduled_ids: set[int] = set()
        decodes = [r for r in self.running if r.num_tokens - r.num_computed == 1]
        decode_load = (len(decodes), sum(r.num_tokens for r in decodes))
        has_preempted = False
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            start = request.num_computed
            num_new = self._chunk(request, start, budget, decode_load)
            while not self._allocate(request, start, num_new):
                has_preempted = True
                if self._preempt_victim(scheduled_ids) is request:
                    break
            else:
                scheduled.append((request, start, num_new))
                scheduled_ids.add(request.index)
                budget -= num_new
                index += 1
        while budget > 0 and not has_preempted and len(self.running) < spec.max_num_seqs:
            queue_ = self.requeued if self.requeued else self.waiting
            if not queue_:
                break
            request = queue_[0]
            bs = spec.block_size
            hit = min(self.shared_blocks, (request.num_tokens - 1) // bs)
            request.cached_blocks = self.shared_blocks
            start = hit * bs if self.is_prefix_published else 0
            num_new = self._chunk(request, start, budget, decode_load)
            if not self._allocate(request, start, num_new):
                break
            if queue_ is self.requeued:
                self.requeued.pop(0)
            else:
                self.waiting.popleft()
            if math.isnan(request.start_s):
                request.start_s = now
            request.num_computed = start
            self.running.append(request)
            scheduled.append((request, start, num_new))
            budget -= num_new
        return scheduled

    def step_seconds(self, scheduled: Sequence[tuple[_Request, int, int]]) -> float:
        tokens = pairs = context = 0
        for _, start, num_new in scheduled:
            tokens += num_new
            pairs += attention_pairs(start, num_new)
            context += start + num_new
        return self.cost.seconds(tokens, len(scheduled), pairs, context)

    def finish_step(self, scheduled: Sequence[tuple[_Request, int, int]], end_s: float) -> int:
        """Advance every scheduled request; returns how many finished."""
        num_finished = 0
        for request, start, num_new in scheduled:
            request.num_computed = start + num_new
            if request.num_computed < request.num_tokens:
                continue  # a prompt chunk: nothing sampled
            request.num_generated += 1
            request.num_tokens += 1
            if request.num_generated == 1:
                request.first_token_s = end_s
            if request.num_generated >= request.num_output:
                request.finish_s = end_s
                self.running.remove(request)
                self._free(request)
                num_finished += 1
        return num_finished


def simulate(
    trace: Sequence[TraceRequest],
    cost: StepCost,
    spec: SchedulerSpec,
    chunk_model: ChunkModel | None = None,
) -> SimResult:
    """Run ``trace`` (sorted by arrival) through the engine's scheduling until every request
    finished. ``chunk_model`` sizes prefill chunks while decoding (default: ``cost`` itself)."""
    engine = _Engine(spec, cost, chunk_model)
    requests = [_Request(i, item) for i, item in enumerate(trace)]
    result = SimResult(
        [], [], [], [], [r.arrival_s for r in requests], [r.num_output for r in requests]
    )
    now, next_arrival, num_unfinished = 0.0, 0, len(requests)
    while num_unfinished:
        while next_arrival < len(requests) and requests[next_arrival].arrival_s <= now:
            result.waiting_at_arrival.append(len(engine.waiting) + len(engine.requeued))
            engine.waiting.append(requests[next_arrival])
            next_arrival += 1
        if not engine.running and not engine.waiting and not engine.requeued:
            now = requests[next_arrival].arrival_s  # idle until the next arrival
            continue
        scheduled = engine.schedule(now)
        if not scheduled:
            raise ValueError("a request can never be scheduled: the KV cache cannot hold it")
        duration = engine.step_seconds(scheduled)
        now += duration
        num_unfinished -= engine.finish_step(scheduled, now)
        result.num_steps += 1
        result.busy_s += duration
        result.step_seqs.append(len(scheduled))
        result.step_tokens.append(sum(n for _, _, n in scheduled))
    result.num_preemptions = engine.num_preemptions
    result.end_s = now
    for r in requests:
        result.ttft_s.append(r.first_token_s - r.arrival_s)
        result.queue_s.append(r.start_s - r.arrival_s)
        result.e2e_s.append(r.finish_s - r.arrival_s)
        gaps = r.num_output - 1
        result.tpot_s.append((r.finish_s - r.first_token_s) / gaps if gaps else math.nan)
    return result
