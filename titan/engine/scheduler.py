"""Continuous batching: which requests run this step, and how many tokens each computes.

Pure Python (no torch, no asyncio). Each step fills a token budget: running requests first, in
priority order (FCFS within a class), then waiting ones. A prompt longer than the budget is
computed in chunks over several steps, so running decodes never wait behind it. When KV blocks run
out, a running request is preempted (its blocks freed, recomputed later): the lowest priority,
then the least computed.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from titan.engine.cost_model import StepCostModel
from titan.engine.kv_cache.context_shift import KVMove
from titan.engine.kv_cache.manager import KVCacheManager, NoFreeBlockError
from titan.engine.request import Request, RequestStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    # While decodes run, a prefill chunk may make a step at most this many times slower than
    # the decodes alone (sized by the step cost model), so a long prompt arriving costs running
    # streams a bounded inter-token gap. None: no such limit.
    max_decode_slowdown: float | None = None
    # The chunk limit while decoding until the cost model has seen enough steps (or always,
    # without a cost model). None: only the token budget.
    max_prefill_chunk_while_decoding: int | None = None
    # Chunks never shrink below this, so a prompt always progresses.
    min_prefill_chunk: int = 16
    check_invariants: bool = True


@dataclass(frozen=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int
    start: int  # position of the first new token (= num_computed_tokens before this step)

    @property
    def samples(self) -> bool:
        """True when this step reaches the end of the known tokens, so a new token is sampled."""
        return self.start + self.num_new_tokens == self.request.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)
    # Copy-on-write of forked sequences: (source, destination) KV blocks to copy, in order,
    # before this step's forward pass writes anything.
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    # Context shift: KV copied (keys rotated) into newly admitted requests' blocks before this
    # step's forward pass; the caller releases their source blocks after (kv.release_moved).
    kv_moves: list[KVMove] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, kv: KVCacheManager, cost_model: StepCostModel | None = None
    ):
        self.config = config
        self.kv = kv
        self.cost_model = cost_model
        self.waiting: list[Request] = []  # sorted by (priority, arrival)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self.num_cached_prompt_tokens = 0
        self._pending_copies: list[tuple[int, int]] = []  # forks made between steps

    # ---- queue management -------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.requests[request.request_id] = request
        self._enqueue_waiting(request)

    def _enqueue_waiting(self, request: Request) -> None:
        keys = [r.sort_key for r in self.waiting]
        self.waiting.insert(bisect.bisect_right(keys, request.sort_key), request)

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        """Finish (stop, length, abort) a request wherever it is; frees its blocks at once."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self.kv.remember(request)
        self.kv.free(request)
        request.status = status
        return request

    @property
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # ---- one step ---------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        self.running.sort(key=lambda r: r.sort_key)
        scheduled_ids: set[str] = set()
        decodes = [r for r in self.running if r.num_tokens - r.num_computed_tokens == 1]
        decode_load = (len(decodes), sum(r.num_tokens for r in decodes))

        output.block_copies, self._pending_copies = self._pending_copies, []
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            if request.num_computed_tokens >= request.num_tokens:
                index += 1  # nothing to compute: a beam waiting for its siblings' round
                continue
            num_new = self._chunk(request, request.num_computed_tokens, budget, decode_load)
            while not self.kv.allocate_slots(request, num_new):
                victim = self._pick_victim(scheduled_ids)
                self._preempt(victim)
                output.preempted_ids.append(victim.request_id)
                if victim is request:
                    break
            else:
                output.scheduled.append(
                    ScheduledRequest(request, num_new, request.num_computed_tokens)
                )
                scheduled_ids.add(request.request_id)
                budget -= num_new
                index += 1

        # Admit waiting requests only when nothing was preempted: a preemption means the pool
        # is short, and admitting would just thrash.
        position = 0
        while (
            position < len(self.waiting)
            and budget > 0
            and not output.preempted_ids
            and len(self.running) < self.config.max_num_seqs
        ):
            request = self.waiting[position]
            if request.share_prompt_with not in self.requests:
                request.share_prompt_with = None  # its sibling is gone: a normal admission
            if request.share_prompt_with is not None:
                forked = self._admit_forked(request, output)
                if forked is None:
                    position += 1  # its sibling has not computed the prompt yet
                    continue
                if not forked:
                    break
                budget -= 1
                continue
            cached = self.kv.find_cached_prefix(request) if request.num_computed_tokens == 0 else []
            shift = self.kv.plan_shift(request, cached) if request.shift_scope else None
            num_computed = shift.reused_end if shift else len(cached) * self.kv.block_size
            num_new = self._chunk(request, num_computed, budget, decode_load)
            if shift is not None:
                moves = self.kv.adopt_shifted(request, cached, shift, num_new)
                if moves is None:
                    break
                output.kv_moves.extend(moves)
            elif not self.kv.allocate_slots(request, num_new, cached):
                break
            self.waiting.pop(position)
            if request.status == RequestStatus.WAITING and num_computed:
                # First admission only: a recompute after preemption is not a prompt-cache hit.
                request.num_cached_tokens = min(num_computed, request.num_prompt_tokens)
                self.num_cached_prompt_tokens += request.num_cached_tokens
            request.num_computed_tokens = num_computed
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            output.scheduled.append(ScheduledRequest(request, num_new, num_computed))
            budget -= num_new

        if not output.scheduled and self.waiting:
            self._preempt_idle(output)
        if self.config.check_invariants:
            self.check_invariants(output)
        return output

    def _preempt_idle(self, output: SchedulerOutput) -> None:
        """Nothing could run: running requests with nothing to compute (beams waiting for their
        round) may hold the blocks a waiting one (a sibling beam) needs. They are preempted,
        so the waiting ones get in next step; they are recomputed when admitted again."""
        for request in [r for r in self.running if r.num_computed_tokens >= r.num_tokens]:
            self._preempt(request)
            output.preempted_ids.append(request.request_id)

    def _admit_forked(self, request: Request, output: SchedulerOutput) -> bool | None:
        """Admit a parallel-sampling child by forking its sibling's prompt KV: all prompt tokens
        but the last are shared, the last is computed (one token, like a decode) so the child
        samples its first token from its own generator. None: hold it (the sibling is still on
        the prompt, or waiting); False: the pool is short; True: admitted."""
        sibling = self.requests[request.share_prompt_with or ""]
        num_shared = request.num_prompt_tokens - 1
        if sibling.status != RequestStatus.RUNNING or sibling.num_computed_tokens < num_shared:
            return None
        try:
            copy = self.kv.fork(sibling, request, num_shared)
        except NoFreeBlockError:
            return False
        if not self.kv.allocate_slots(request, 1):
            self.kv.free(request)
            request.num_computed_tokens = 0
            return False
        if copy is not None:
            output.block_copies.append(copy)
        request.share_prompt_with = None
        self.waiting.remove(request)
        request.num_cached_tokens = num_shared
        self.num_cached_prompt_tokens += num_shared
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        output.scheduled.append(ScheduledRequest(request, 1, num_shared))
        return True

    def _chunk(
        self, request: Request, start: int, budget: int, decode_load: tuple[int, int]
    ) -> int:
        """Tokens to compute for ``request`` from ``start``: all that remain, within the budget,
        and, while decodes run, within the chunk limit."""
        num_remaining = request.num_tokens - start
        num_new = min(num_remaining, budget)
        num_decodes, num_decode_pairs = decode_load
        if num_remaining == 1 or not num_decodes:
            return num_new
        limit = self.config.max_prefill_chunk_while_decoding
        slowdown = self.config.max_decode_slowdown
        if self.cost_model is not None and slowdown is not None:
            fitted = self.cost_model.max_prefill_tokens(
                start, num_decodes, num_decode_pairs, slowdown
            )
            limit = fitted if fitted is not None else limit
        if limit is None:
            return num_new
        return min(num_new, max(limit, self.config.min_prefill_chunk))

    def _pick_victim(self, scheduled_ids: set[str]) -> Request:
        """Lowest priority (highest value), then least computed, then latest arrival, among the
        running requests not yet scheduled this step."""
        candidates = [r for r in self.running if r.request_id not in scheduled_ids]
        return max(candidates, key=lambda r: (r.priority, -r.num_computed_tokens, r.arrival_seq))

    def fork(self, parent: Request, child: Request) -> None:
        """Add ``child``, whose tokens extend ``parent``'s, sharing the parent's computed KV
        (beam search). A parent without its KV (preempted) or a pool without a block for the
        copy-on-write: the child queues and is computed like any request (prefix cache first)."""
        if child.request_id in self.requests:
            raise ValueError(f"duplicate request id {child.request_id!r}")
        if parent.status == RequestStatus.RUNNING and parent.num_computed_tokens > 0:
            try:
                copy = self.kv.fork(parent, child, parent.num_computed_tokens)
            except NoFreeBlockError:
                copy = None
            else:
                if copy is not None:
                    self._pending_copies.append(copy)
                self.requests[child.request_id] = child
                child.status = RequestStatus.RUNNING
                self.running.append(child)
                return
        self.add_request(child)

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        self.num_preemptions += 1
        self._enqueue_waiting(request)

    def update(self, output: SchedulerOutput, sampled: dict[str, int]) -> list[Request]:
        """Advance computed tokens, append sampled tokens, and finish requests that hit EOS, a stop
        token, max_tokens or the context window. Returns the requests that got a new token."""
        updated = []
        for item in output.scheduled:
            request = item.request
            if request.is_finished:  # aborted between schedule and update
                continue
            request.num_computed_tokens = item.start + item.num_new_tokens
            token_id = sampled.get(request.request_id)
            if token_id is None:
                continue
            request.append_output_token(token_id)
            updated.append(request)
            status = self._stop_status(request, token_id)
            if status is not None:
                self.finish_request(request.request_id, status)
        return updated

    def _stop_status(self, request: Request, token_id: int) -> RequestStatus | None:
        params = request.params
        if request.num_output_tokens >= params.min_tokens:
            if token_id in params.stop_token_ids:
                request.stop_reason = token_id
                return RequestStatus.FINISHED_STOPPED
            if not params.ignore_eos and token_id in request.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if request.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    # ---- invariants -------------------------------------------------------------------------

    def check_invariants(self, output: SchedulerOutput) -> None:
        if len(self.running) > self.config.max_num_seqs:
            raise AssertionError(f"{len(self.running)} running > max_num_seqs")
        if output.num_batched_tokens > self.config.max_num_batched_tokens:
            raise AssertionError("token budget exceeded")
        ids = [s.request.request_id for s in output.scheduled]
        if len(ids) != len(set(ids)):
            raise AssertionError("a request was scheduled twice in one step")
        for item in output.scheduled:
            request = item.request
            if request.status != RequestStatus.RUNNING:
                raise AssertionError(f"scheduled {request} is not running")
            end = item.start + item.num_new_tokens
            if item.num_new_tokens < 1 or end > request.num_tokens:
                raise AssertionError(f"bad token count for {request}")
            if len(request.block_ids) < self.kv.blocks_for(end):
                raise AssertionError(f"{request} lacks blocks for {end} tokens")
        for request in self.waiting:
            if request.block_ids or request.num_computed_tokens:
                raise AssertionError(f"waiting {request} holds KV state")
        # Shared blocks count once per holder, so holders can only outnumber used blocks.
        held = sum(len(r.block_ids) for r in self.running)
        held += sum(len(move.held_block_ids) for move in output.kv_moves)
        if held < self.kv.num_total_blocks - self.kv.num_free_blocks:
            raise AssertionError("blocks are in use that no running request holds (a leak)")
