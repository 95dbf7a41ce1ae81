"""The engine's core step, on token ids only: schedule → execute (forward pass, sample) → update.

The core owns the scheduler, the KV cache, the model runner and the per-request sampling state
(generators, grammar matchers, beams). It never decodes text: each step hands back one
``CoreOutput`` per request that moved, and the output processor turns those into text. A stop
string is the one stop the core cannot see; the engine reports it with ``finish_request``.
"""

from __future__ import annotations

import functools
import random
import time
from dataclasses import dataclass

import torch

from titan.engine.beam_scoring import BeamSearchGroup, FinishedBeam
from titan.engine.beam_search import BeamSearchDriver
from titan.engine.builder import BuiltEngine
from titan.engine.config import EngineConfig
from titan.engine.constraints import GrammarCache, MaskWorker
from titan.engine.cost_model import StepCostModel, attention_pairs
from titan.engine.grammar_closing import GrammarCloser
from titan.engine.kv_cache.manager import KVCacheManager
from titan.engine.outputs import EngineStats
from titan.engine.request import Request, RequestStatus, arrival_counter
from titan.engine.runner import ModelRunner
from titan.engine.sampler import SampledToken, SamplingRow
from titan.engine.sampling_params import BeamSearchParams, SamplingParams
from titan.engine.scheduler import Scheduler, SchedulerConfig
from titan.errors import ContextLengthExceededError, InvalidRequestError


@dataclass(frozen=True)
class CoreOutput:
    """What one step did to one request, in token ids."""

    request_id: str
    token: SampledToken | None  # None: finished without a new token (aborted)
    # The EOS or stop token id that ended the request: not part of the text.
    is_stop_token: bool
    status: RequestStatus
    stop_reason: int | None  # the stop token id that ended the request, if one did
    num_prompt_tokens: int
    num_output_tokens: int  # cumulative
    num_cached_tokens: int
    # A finished beam search only: its sequences, best first (empty when aborted).
    beams: tuple[FinishedBeam, ...] | None = None

    @classmethod
    def of(cls, request: Request, token: SampledToken | None, is_stop_token: bool) -> CoreOutput:
        return cls(
            request.request_id,
            token,
            is_stop_token,
            request.status,
            request.stop_reason,
            request.num_prompt_tokens,
            request.num_output_tokens,
            request.num_cached_tokens,
        )

    @classmethod
    def of_beam_search(cls, group: BeamSearchGroup, is_aborted: bool) -> CoreOutput:
        beams = () if is_aborted else tuple(group.results())
        return cls(
            group.request_id,
            None,
            False,
            RequestStatus.FINISHED_ABORTED if is_aborted else RequestStatus.FINISHED_STOPPED,
            None,
            len(group.prompt_token_ids),
            sum(len(beam.token_ids) for beam in beams),
            0,
            beams,
        )


@dataclass
class _Sequence:
    request: Request
    row: SamplingRow


class EngineCore:
    def __init__(self, config: EngineConfig, built: BuiltEngine):
        self.config = config
        self.max_model_len = built.max_model_len
        # The vocabulary only (validation, grammar masks, closing text): the core never decodes.
        self._tokenizer = built.tokenizer
        # Structured output: compiled grammars (built on first use) and the mask thread.
        self.grammars = GrammarCache(
            built.hf_dir / "tokenizer.json",
            built.tokenizer.vocab_size,
            built.tokenizer.eos_token_ids,
        )
        self._mask_worker = MaskWorker(self.grammars)
        self.runner = ModelRunner(
            built.model.model, built.kv_spec, built.num_kv_blocks, built.model.attention
        )
        self.kv = KVCacheManager(
            built.num_kv_blocks, config.block_size, enable_caching=config.enable_prefix_caching
        )
        self.cost_model = StepCostModel()
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_model_len=self.max_model_len,
                max_decode_slowdown=config.max_decode_slowdown,
                max_prefill_chunk_while_decoding=config.max_prefill_chunk_while_decoding,
                check_invariants=config.check_invariants,
            ),
            self.kv,
            self.cost_model,
        )
        self._sequences: dict[str, _Sequence] = {}
        self.beams = BeamSearchDriver(
            self.scheduler, built.tokenizer.eos_token_ids, self.max_model_len
        )
        self._arrivals = arrival_counter()
        self._stats = EngineStats(block_size=config.block_size)

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        num_prompt = len(prompt_token_ids)
        if num_prompt == 0:
            raise InvalidRequestError(
                "The prompt is empty: give at least one token.", param="prompt"
            )
        vocab = self._tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in prompt_token_ids):
            raise InvalidRequestError(
                f"The prompt holds token ids outside the vocabulary [0, {vocab}).", param="prompt"
            )
        total = num_prompt + params.max_tokens
        if num_prompt >= self.max_model_len or total > self.max_model_len:
            raise ContextLengthExceededError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {total} tokens ({num_prompt} in the prompt, {params.max_tokens} "
                f"for the completion). Please reduce the prompt or max_tokens.",
                param="messages",
            )
        if params.structured is not None:
            # A bad spec, or a max_tokens no valid output fits, is a 400 before any work.
            self.grammars.check_room(params.structured, params.max_tokens, self.closer)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        share_prompt_with: str | None = None,
        shift_scope: str | None = None,
    ) -> None:
        self._check_new(request_id, prompt_token_ids, params)
        request = Request(
            request_id,
            prompt_token_ids,
            params,
            priority=priority,
            arrival_seq=next(self._arrivals),
            eos_token_ids=self._tokenizer.eos_token_ids,
            shift_scope=shift_scope,
        )
        sibling = self._sequences.get(share_prompt_with or "")
        if sibling is not None and sibling.request.prompt_token_ids == request.prompt_token_ids:
            request.share_prompt_with = share_prompt_with
        generator = torch.Generator()
        generator.manual_seed(params.seed if params.seed is not None else random.getrandbits(63))
        row = SamplingRow(params, generator, list(prompt_token_ids), [])
        if params.structured is not None:
            row.constraint = self.grammars.new_state(params.structured, self.closer)
        self._sequences[request_id] = _Sequence(request, row)
        self.scheduler.add_request(request)
        self._count_added(prompt_token_ids)

    def add_beam_search(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        beam: BeamSearchParams,
        priority: int = 0,
    ) -> None:
        self._check_new(request_id, prompt_token_ids, params)
        arrival_seq = next(self._arrivals)
        self.beams.add(
            request_id, prompt_token_ids, params, beam, priority=priority, arrival_seq=arrival_seq
        )
        self._count_added(prompt_token_ids)

    def _check_new(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        self.validate(prompt_token_ids, params)
        if request_id in self._sequences or request_id in self.beams.groups:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")

    def _count_added(self, prompt_token_ids: list[int]) -> None:
        self._stats.num_requests_added += 1
        self._stats.num_prompt_tokens += len(prompt_token_ids)

    def request_ids(self) -> list[str]:
        """The callers' ids of the unfinished requests (beam searches by their group id)."""
        return [*self._sequences, *self.beams.groups]

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def abort_request(self, request_id: str) -> CoreOutput | None:
        sequence = self._sequences.get(request_id)
        if sequence is None:
            group = self.beams.abort(request_id)
            if group is None:
                return None
            self._stats.num_requests_aborted += 1
            return CoreOutput.of_beam_search(group, is_aborted=True)
        self._stats.num_requests_aborted += 1
        self.finish_request(request_id, RequestStatus.FINISHED_ABORTED)
        return CoreOutput.of(sequence.request, None, is_stop_token=False)

    def finish_request(
        self, request_id: str, status: RequestStatus = RequestStatus.FINISHED_STOPPED
    ) -> None:
        """End a request now (an abort; a stop string the output processor found)."""
        self.scheduler.finish_request(request_id, status)
        self._sequences.pop(request_id)
        self._stats.num_requests_finished += 1

    def step(self) -> list[CoreOutput]:
        schedule = self.scheduler.schedule()
        self._stats.num_preemptions = self.scheduler.num_preemptions
        self.runner.copy_blocks(schedule.block_copies)
        if schedule.kv_moves:
            self.runner.move_kv(schedule.kv_moves)
            self.kv.release_moved(schedule.kv_moves)
            self._stats.num_shifted_tokens += sum(len(m.source_slots) for m in schedule.kv_moves)
        if schedule.is_empty:
            return []
        rows = {}
        for item in schedule.scheduled:
            request_id = item.request.request_id
            if item.samples and self.beams.owns(request_id):
                rows[request_id] = self.beams.row(request_id)
            elif item.samples:
                rows[request_id] = self._prepare_row(self._sequences[request_id])
        # Constrained rows' masks are computed on the mask thread while the forward pass runs.
        self._mask_worker.start(list(rows.values()))
        started = time.perf_counter()
        sampled = self.runner.execute(schedule.scheduled, rows)
        num_chunks = sum(s.num_new_tokens > 1 for s in schedule.scheduled)
        self.cost_model.observe(
            schedule.num_batched_tokens,
            sum(attention_pairs(s.start, s.num_new_tokens) for s in schedule.scheduled),
            time.perf_counter() - started,
            is_mixed=0 < num_chunks < len(schedule.scheduled),
        )
        self._stats.num_steps += 1
        for item in schedule.scheduled:
            if item.start < item.request.num_prompt_tokens:
                prompt_end = min(item.start + item.num_new_tokens, item.request.num_prompt_tokens)
                self._stats.num_computed_prompt_tokens += prompt_end - item.start
        updated = self.scheduler.update(
            schedule,
            {rid: token.token_id for rid, token in sampled.items() if not self.beams.owns(rid)},
        )
        self._stats.num_generated_tokens += len(updated)
        outputs = [self._update(request, sampled[request.request_id]) for request in updated]
        finished_beams = self.beams.on_sampled(sampled)
        self._stats.num_requests_finished += len(finished_beams)
        return outputs + [CoreOutput.of_beam_search(g, is_aborted=False) for g in finished_beams]

    def _prepare_row(self, sequence: _Sequence) -> SamplingRow:
        request, row = sequence.request, sequence.row
        row.output_token_ids = request.output_token_ids
        row.banned_token_ids = self._banned(request)
        if row.constraint is not None:
            # A constrained row keeps a way to end its grammar within max_tokens.
            remaining = request.params.max_tokens - request.num_output_tokens
            row.forced_token_id = row.constraint.forced_token(remaining)
            row.vet = functools.partial(row.constraint.vet, remaining=remaining)
        return row

    def _update(self, request: Request, token: SampledToken) -> CoreOutput:
        """The grammar moves with the new token; the request's output in token ids."""
        is_stop_token = request.status == RequestStatus.FINISHED_STOPPED and (
            request.stop_reason == token.token_id or token.token_id in request.eos_token_ids
        )
        constraint = self._sequences[request.request_id].row.constraint
        if constraint is not None and not is_stop_token:
            constraint.advance(token.token_id)
            if constraint.is_complete and not request.is_finished:
                # The grammar is closed: nothing but EOS could follow, so stop now.
                self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_STOPPED)
            elif request.status == RequestStatus.FINISHED_LENGTH and constraint.is_satisfied:
                # Steered to a whole output by the last token: it ended, not cut off.
                request.status = RequestStatus.FINISHED_STOPPED
        if request.is_finished:
            self._sequences.pop(request.request_id)
            self._stats.num_requests_finished += 1
        return CoreOutput.of(request, token, is_stop_token)

    @functools.cached_property
    def closer(self) -> GrammarCloser:
        """Built on the first constrained request (~50 ms: a look at every token)."""
        tokenizer = self._tokenizer
        return GrammarCloser(tokenizer.token_bytes, tokenizer.vocab_size, tokenizer.encode)

    @staticmethod
    def _banned(request: Request) -> tuple[int, ...]:
        params = request.params
        if request.num_output_tokens >= params.min_tokens:
            return ()
        if params.structured is not None:
            # The grammar decides where the output may end; banning EOS there would leave
            # no allowed token.
            return params.stop_token_ids
        eos = () if params.ignore_eos else request.eos_token_ids
        return (*eos, *params.stop_token_ids)

    def close(self) -> None:
        self._mask_worker.close()

    def reset_stats(self) -> None:
        self._stats = EngineStats(block_size=self.config.block_size)
        self.scheduler.num_preemptions = 0
        self.scheduler.num_cached_prompt_tokens = 0

    def stats(self) -> EngineStats:
        stats = self._stats
        stats.num_running = len(self.scheduler.running)
        stats.num_waiting = len(self.scheduler.waiting)
        stats.num_free_blocks = self.kv.num_free_blocks
        stats.num_total_blocks = self.kv.num_total_blocks
        stats.num_cached_prompt_tokens = self.scheduler.num_cached_prompt_tokens
        stats.num_preemptions = self.scheduler.num_preemptions
        return EngineStats(**{**stats.__dict__, "extra": dict(stats.extra)})
