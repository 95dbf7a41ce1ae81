"""The synchronous engine: add requests, ``step()`` until done. AsyncEngine drives it from a thread.

Three jobs, apart (as in vLLM v1): ``builder`` builds (weights, device, kernels, KV sizing) once;
``EngineCore`` runs each step on token ids (schedule → one forward pass → sample → update);
``OutputProcessor`` turns its token ids into text (detokenizing, stop strings, logprob texts).
"""

from __future__ import annotations

import logging
import time

from titan.engine.builder import build_engine
from titan.engine.config import EngineConfig
from titan.engine.constraints import GrammarCache
from titan.engine.core import EngineCore
from titan.engine.cost_model import StepCostModel
from titan.engine.kv_cache.manager import KVCacheManager
from titan.engine.output_processor import OutputProcessor
from titan.engine.outputs import EngineStats, RequestOutput
from titan.engine.runner import ModelRunner
from titan.engine.sampling_params import BeamSearchParams, SamplingParams
from titan.engine.scheduler import Scheduler

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, config: EngineConfig):
        started = time.perf_counter()
        self.config = config
        built = build_engine(config)
        self.model_name = built.model_name
        self.max_model_len = built.max_model_len
        self.tokenizer = built.tokenizer
        self.built = built.model
        self.device_type: str = built.model.model.device.type  # "cpu", "cuda"
        self.dtype = built.model.kv_dtype
        self.core = EngineCore(config, built)
        self.output_processor = OutputProcessor(built.tokenizer)
        log.info(
            "engine ready: model=%s params=%.1fM running %s; "
            "kv_cache=%d blocks x %d tokens = %d tokens (%.0f MiB) max_model_len=%d in %.1fs",
            self.model_name,
            built.model.model.num_parameters / 1e6,
            built.model.description,
            built.num_kv_blocks,
            config.block_size,
            built.num_kv_blocks * config.block_size,
            built.num_kv_blocks * built.kv_spec.bytes_per_block / 2**20,
            self.max_model_len,
            time.perf_counter() - started,
        )

    # The core's parts, for the tests and benchmarks that look inside.
    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def kv(self) -> KVCacheManager:
        return self.core.kv

    @property
    def runner(self) -> ModelRunner:
        return self.core.runner

    @property
    def cost_model(self) -> StepCostModel:
        return self.core.cost_model

    @property
    def grammars(self) -> GrammarCache:
        return self.core.grammars

    def validate_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.core.validate(prompt_token_ids, params)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        share_prompt_with: str | None = None,
        shift_scope: str | None = None,
    ) -> None:
        """``share_prompt_with``: the id of a request with the same prompt (n > 1): this one
        forks that request's prompt KV instead of computing the prompt again. ``shift_scope``:
        the conversation this request continues; its prompt may reuse the KV of the scope's
        last sequence with a stretch dropped (context shift, approximate)."""
        self.core.add_request(
            request_id, prompt_token_ids, params, priority, share_prompt_with, shift_scope
        )
        self.output_processor.add_request(request_id, prompt_token_ids, params)

    def add_beam_search(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        beam: BeamSearchParams,
        priority: int = 0,
    ) -> None:
        """Beam search: one finished output at the end, its ``beams`` the best sequences."""
        self.core.add_beam_search(request_id, prompt_token_ids, params, beam, priority)
        self.output_processor.add_beam_search(request_id, params)

    def request_ids(self) -> list[str]:
        """The callers' ids of the unfinished requests (beam searches by their group id)."""
        return self.core.request_ids()

    def abort_request(self, request_id: str) -> RequestOutput | None:
        aborted = self.core.abort_request(request_id)
        return None if aborted is None else self.output_processor.process(aborted)

    @property
    def has_unfinished(self) -> bool:
        return self.core.has_unfinished

    def step(self) -> list[RequestOutput]:
        outputs = []
        for core_output in self.core.step():
            output = self.output_processor.process(core_output)
            if output.is_finished and not core_output.status.is_finished:
                # A stop string: only the output processor sees the text.
                self.core.finish_request(output.request_id)
            outputs.append(output)
        return outputs

    def close(self) -> None:
        self.core.close()
        self.built.close()

    def reset_stats(self) -> None:
        self.core.reset_stats()

    def stats(self) -> EngineStats:
        return self.core.stats()
