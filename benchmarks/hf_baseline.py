"""The baselines: HF transformers ``generate`` on the same weights, one request at a time and in
static padded batches. transformers and torch are imported inside functions (no import-time cost).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks.workload import BenchRequest, StreamRun, WorkloadRun


class TokenClock:
    """A ``generate`` streamer that notes when each new token exists.

    ``generate`` first hands the streamer the prompt, then every decoding step's tokens (one per
    sequence in the batch) right after they are chosen: the second call is the first token.
    """

    def __init__(self) -> None:
        self.token_times: list[float] = []
        self._has_seen_prompt = False

    def put(self, value: Any) -> None:
        if not self._has_seen_prompt:
            self._has_seen_prompt = True
            return
        self.token_times.append(time.perf_counter())

    def end(self) -> None:
        pass


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No weight-loading progress bar in the benchmark's console output."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def load_hf_model(hf_dir: Path, dtype: Any) -> Any:
    """The same weights Titan serves, as a transformers model in ``dtype`` (a torch.dtype)."""
    from transformers import AutoModelForCausalLM

    with _quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype)
    return model.eval()


def generate_timed(
    model: Any, prompts: Sequence[list[int]], num_new_tokens: int, pad_token_id: int
) -> list[float]:
    """Greedy ``generate`` of exactly ``num_new_tokens`` tokens for every prompt (left-padded to
    one batch); returns the time each decoding step's tokens appeared."""
    import torch

    longest = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_token_id] * (longest - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    clock = TokenClock()
    output = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        do_sample=False,
        # min == max: EOS is suppressed, so HF generates exactly as many tokens as Titan does
        # with ignore_eos.
        max_new_tokens=num_new_tokens,
        min_new_tokens=num_new_tokens,
        use_cache=True,
        pad_token_id=pad_token_id,
        streamer=clock,
    )
    num_generated = output.shape[1] - longest
    if num_generated != num_new_tokens or len(clock.token_times) != num_new_tokens:
        raise RuntimeError(
            f"HF generate produced {num_generated} tokens ({len(clock.token_times)} streamed), "
            f"expected {num_new_tokens}"
        )
    return clock.token_times


def warm_up(model: Any, pad_token_id: int) -> None:
    """One short padded batch, so that one-time costs do not land on the first timed request."""
    generate_timed(model, [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12]], 4, pad_token_id)


def run_sequential(model: Any, requests: Sequence[BenchRequest], pad_token_id: int) -> WorkloadRun:
    """One request at a time, in arrival order: each waits for all those before it."""
    ttft_s = {}
    start = time.perf_counter()
    for request in requests:
        token_times = generate_timed(
            model, [request.prompt_token_ids], request.max_tokens, pad_token_id
        )
        ttft_s[request.request_id] = token_times[0] - start
    wall_s = time.perf_counter() - start
    return WorkloadRun(
        system="hf_sequential",
        wall_s=wall_s,
        num_generated_tokens=sum(r.max_tokens for r in requests),
        ttft_s=ttft_s,
    )


def run_static_batches(
    model: Any, requests: Sequence[BenchRequest], batch_size: int, pad_token_id: int
) -> WorkloadRun:
    """Batches of ``batch_size`` in arrival order; a batch runs until its longest max_tokens.
    The tokens a request makes past its own max_tokens are waste and are not counted."""
    ttft_s = {}
    start = time.perf_counter()
    for first in range(0, len(requests), batch_size):
        batch = requests[first : first + batch_size]
        token_times = generate_timed(
            model,
            [r.prompt_token_ids for r in batch],
            max(r.max_tokens for r in batch),
            pad_token_id,
        )
        for request in batch:
            ttft_s[request.request_id] = token_times[0] - start
    wall_s = time.perf_counter() - start
    return WorkloadRun(
        system="hf_static_batch",
        wall_s=wall_s,
        num_generated_tokens=sum(r.max_tokens for r in requests),
        ttft_s=ttft_s,
    )


def run_single_stream(
    model: Any, prompt_token_ids: list[int], num_new_tokens: int, pad_token_id: int
) -> StreamRun:
    start = time.perf_counter()
    token_times = generate_timed(model, [prompt_token_ids], num_new_tokens, pad_token_id)
    return StreamRun(
        system="hf",
        num_prompt_tokens=len(prompt_token_ids),
        num_generated_tokens=num_new_tokens,
        first_token_s=token_times[0] - start,
        last_token_s=token_times[-1] - start,
    )
