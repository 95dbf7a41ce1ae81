"""The synchronous engine: add requests, ``step()`` until done. AsyncEngine drives it from a thread.

One step = schedule → one forward pass → sample → update token accounting → detokenize (stop
strings) → incremental outputs.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from dataclasses import dataclass, field

import torch

from titan.engine.beam_search import BeamSearchDriver
from titan.engine.builder import build_model
from titan.engine.config import EngineConfig
from titan.engine.constraints import GrammarCache, MaskWorker
from titan.engine.cost_model import StepCostModel, attention_pairs
from titan.engine.detokenizer import IncrementalDetokenizer
from titan.engine.device import resolve_device
from titan.engine.grammar_closing import GrammarCloser
from titan.engine.kv_cache.manager import KVCacheManager
from titan.engine.model.loader import load_config, resolve_model
from titan.engine.outputs import EngineStats, FinishReason, RequestOutput, TokenLogprob, TopLogprob
from titan.engine.request import Request, RequestStatus, arrival_counter
from titan.engine.runner import KVCacheSpec, ModelRunner
from titan.engine.sampler import SampledToken, SamplingRow
from titan.engine.sampling_params import BeamSearchParams, SamplingParams
from titan.engine.scheduler import Scheduler, SchedulerConfig
from titan.engine.tokenizer import Tokenizer
from titan.errors import ContextLengthExceededError, InvalidRequestError

log = logging.getLogger(__name__)

# The up-front check looks this far for the shortest output a constrained request allows.

_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
}


@dataclass
class _RequestState:
    request: Request
    detokenizer: IncrementalDetokenizer
    row: SamplingRow
    pending_token_ids: list[int] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)


class Engine:
    def __init__(self, config: EngineConfig):
        started = time.perf_counter()
        self.config = config
        torch.set_num_threads(config.resolved_num_threads())
        source = resolve_model(config.model, config.resolved_cache_dir() / "models")
        self.model_name = config.served_model_name or source.name
        model_config = load_config(source.hf_dir)
        self.device = resolve_device(config.device)
        self.max_model_len = min(
            config.max_model_len or model_config.max_position_embeddings,
            model_config.max_position_embeddings,
        )
        self.tokenizer = Tokenizer(
            source.hf_dir, model_config.eos_token_ids, model_config.bos_token_id
        )
        # Structured output: compiled grammars (built on first use) and the mask thread.
        self.grammars = GrammarCache(
            source.hf_dir / "tokenizer.json",
            self.tokenizer.vocab_size,
            self.tokenizer.eos_token_ids,
        )
        self._mask_worker = MaskWorker(self.grammars)
        self.built = build_model(config, source, model_config, self.device, self.max_model_len)
        self.dtype = self.built.kv_dtype
        spec = KVCacheSpec(
            num_layers=model_config.num_hidden_layers,
            num_kv_heads=model_config.num_key_value_heads,
            head_dim=model_config.head_dim,
            block_size=config.block_size,
            dtype=self.dtype,
        )
        num_blocks = config.num_kv_blocks or max(2, config.kv_cache_bytes // spec.bytes_per_block)
        if num_blocks * config.block_size < self.max_model_len:
            # A sequence longer than the whole cache could never run: the window shrinks to fit.
            log.warning(
                "the KV cache holds %d tokens, fewer than the context window (%d): serving a "
                "%d-token window; raise --kv-cache-memory to serve the full one",
                num_blocks * config.block_size,
                self.max_model_len,
                num_blocks * config.block_size,
            )
            self.max_model_len = num_blocks * config.block_size
        self.runner = ModelRunner(self.built.model, spec, num_blocks, self.built.attention)
        self.kv = KVCacheManager(
            num_blocks, config.block_size, enable_caching=config.enable_prefix_caching
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
        self._states: dict[str, _RequestState] = {}
        self.beams = BeamSearchDriver(self.scheduler, self.tokenizer, self.max_model_len)
        self._arrivals = arrival_counter()
        self._stats = EngineStats(block_size=config.block_size)
        log.info(
            "engine ready: model=%s params=%.1fM running %s; "
            "kv_cache=%d blocks x %d tokens = %d tokens (%.0f MiB) max_model_len=%d in %.1fs",
            self.model_name,
            self.built.model.num_parameters / 1e6,
            self.built.description,
            num_blocks,
            config.block_size,
            num_blocks * config.block_size,
            num_blocks * spec.bytes_per_block / 2**20,
            self.max_model_len,
            time.perf_counter() - started,
        )

    def validate_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        num_prompt = len(prompt_token_ids)
        if num_prompt == 0:
            raise InvalidRequestError(
                "The prompt is empty: give at least one token.", param="prompt"
            )
        vocab = self.tokenizer.vocab_size
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
    ) -> None:
        """``share_prompt_with``: the id of a request with the same prompt (n > 1): this one
        forks that request's prompt KV instead of computing the prompt again."""
        self.validate_prompt(prompt_token_ids, params)
        if request_id in self._states or request_id in self.beams.groups:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        request = Request(
            request_id,
            prompt_token_ids,
            params,
            priority=priority,
            arrival_seq=next(self._arrivals),
            eos_token_ids=self.tokenizer.eos_token_ids,
        )
        sibling = self._states.get(share_prompt_with or "")
        if sibling is not None and sibling.request.prompt_token_ids == request.prompt_token_ids:
            request.share_prompt_with = share_prompt_with
        generator = torch.Generator()
        generator.manual_seed(params.seed if params.seed is not None else random.getrandbits(63))
        detokenizer = IncrementalDetokenizer(
            self.tokenizer,
            prompt_token_ids,
            skip_special_tokens=params.skip_special_tokens,
            stop=params.stop,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
        row = SamplingRow(params, generator, list(prompt_token_ids), [])
        if params.structured is not None:
            row.constraint = self.grammars.new_state(params.structured, self.closer)
        self._states[request_id] = _RequestState(request, detokenizer, row)
        self.scheduler.add_request(request)
        self._stats.num_requests_added += 1
        self._stats.num_prompt_tokens += len(prompt_token_ids)

    def add_beam_search(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        beam: BeamSearchParams,
        priority: int = 0,
    ) -> None:
        """Beam search: one finished output at the end, its ``beams`` the best sequences."""
        self.validate_prompt(prompt_token_ids, params)
        if request_id in self._states or request_id in self.beams.groups:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        arrival_seq = next(self._arrivals)
        self.beams.add(
            request_id, prompt_token_ids, params, beam, priority=priority, arrival_seq=arrival_seq
        )
        self._stats.num_requests_added += 1
        self._stats.num_prompt_tokens += len(prompt_token_ids)

    def request_ids(self) -> list[str]:
        """The callers' ids of the unfinished requests (beam searches by their group id)."""
        return [*self._states, *self.beams.groups]

    def abort_request(self, request_id: str) -> RequestOutput | None:
        state = self._states.get(request_id)
        if state is None:
            aborted = self.beams.abort(request_id)
            if aborted is not None:
                self._stats.num_requests_aborted += 1
            return aborted
        self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED)
        self._stats.num_requests_aborted += 1
        return self._finish(state)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self) -> list[RequestOutput]:
        schedule = self.scheduler.schedule()
        self._stats.num_preemptions = self.scheduler.num_preemptions
        self._copy_blocks(schedule.block_copies)
        if schedule.is_empty:
            return []
        rows = {}
        for item in schedule.scheduled:
            if item.samples and self.beams.owns(item.request.request_id):
                rows[item.request.request_id] = self.beams.row(item.request.request_id)
            elif item.samples:
                state = self._states[item.request.request_id]
                state.row.output_token_ids = item.request.output_token_ids
                state.row.banned_token_ids = self._banned(item.request)
                if state.row.constraint is not None:
                    self._steer(item.request, state.row)
                rows[item.request.request_id] = state.row
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
        outputs = []
        for request in updated:
            state = self._states[request.request_id]
            output = self._process_token(state, sampled[request.request_id])
            if output is not None:
                outputs.append(output)
        finished_beams = self.beams.on_sampled(sampled)
        self._stats.num_requests_finished += len(finished_beams)
        return outputs + finished_beams

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write of forked sequences, in order, before the forward pass writes."""
        for source, destination in copies:
            for key_cache, value_cache in self.runner.kv_caches:
                key_cache[destination].copy_(key_cache[source])
                value_cache[destination].copy_(value_cache[source])

    def close(self) -> None:
        self._mask_worker.close()
        self.built.close()

    @staticmethod
    def _steer(request: Request, row: SamplingRow) -> None:
        """A constrained row keeps a way to end its grammar within max_tokens (ConstraintState)."""
        remaining = request.params.max_tokens - request.num_output_tokens
        constraint = row.constraint
        row.forced_token_id = constraint.forced_token(remaining)  # type: ignore[union-attr]
        row.vet = functools.partial(constraint.vet, remaining=remaining)  # type: ignore[union-attr]

    @functools.cached_property
    def closer(self) -> GrammarCloser:
        """Built on the first constrained request (~50 ms: a look at every token)."""
        tokenizer = self.tokenizer
        return GrammarCloser(tokenizer.token_bytes, tokenizer.vocab_size, tokenizer.encode)

    def _banned(self, request: Request) -> tuple[int, ...]:
        params = request.params
        if request.num_output_tokens >= params.min_tokens:
            return ()
        if params.structured is not None:
            # The grammar decides where the output may end; banning EOS there would leave
            # no allowed token.
            return params.stop_token_ids
        eos = () if params.ignore_eos else request.eos_token_ids
        return (*eos, *params.stop_token_ids)

    def _process_token(self, state: _RequestState, token: SampledToken) -> RequestOutput | None:
        request = state.request
        state.pending_token_ids.append(token.token_id)
        if token.logprob is not None:
            state.pending_logprobs.append(self._token_logprob(token))
        ends_by_token = request.status == RequestStatus.FINISHED_STOPPED and (
            request.stop_reason == token.token_id or token.token_id in request.eos_token_ids
        )
        if not ends_by_token:
            state.detokenizer.add_token(token.token_id)
        constraint = state.row.constraint
        if constraint is not None and not ends_by_token:
            constraint.advance(token.token_id)
            if constraint.is_complete and not request.is_finished:
                # The grammar is closed: nothing but EOS could follow, so stop now.
                self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_STOPPED)
            elif request.status == RequestStatus.FINISHED_LENGTH and constraint.is_satisfied:
                # Steered to a whole output by the last token: it ended, not cut off.
                request.status = RequestStatus.FINISHED_STOPPED
        if state.detokenizer.stop_string is not None and not request.is_finished:
            request.stop_reason = state.detokenizer.stop_string
            self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_STOPPED)
        if request.is_finished:
            return self._finish(state)
        text = state.detokenizer.take_released(is_finished=False)
        return self._emit(state, text)

    def _finish(self, state: _RequestState) -> RequestOutput:
        self._states.pop(state.request.request_id, None)
        self._stats.num_requests_finished += 1
        state.detokenizer.flush()
        return self._emit(state, state.detokenizer.take_released(is_finished=True))

    def _emit(self, state: _RequestState, text: str) -> RequestOutput:
        request = state.request
        output = RequestOutput(
            request_id=request.request_id,
            text=text,
            token_ids=tuple(state.pending_token_ids),
            logprobs=tuple(state.pending_logprobs) if request.params.logprobs is not None else None,
            is_finished=request.is_finished,
            finish_reason=_FINISH_REASONS.get(request.status),
            stop_reason=request.stop_reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            num_cached_tokens=request.num_cached_tokens,
        )
        state.pending_token_ids = []
        state.pending_logprobs = []
        return output

    def _token_logprob(self, token: SampledToken) -> TokenLogprob:
        tokenizer = self.tokenizer
        top = tuple(
            TopLogprob(tid, tokenizer.token_text(tid), tokenizer.token_bytes(tid), lp)
            for tid, lp in token.top
        )
        return TokenLogprob(
            token.token_id,
            tokenizer.token_text(token.token_id),
            tokenizer.token_bytes(token.token_id),
            token.logprob if token.logprob is not None else 0.0,
            top,
        )

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
