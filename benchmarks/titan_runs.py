"""Titan's side of the engine benchmark: the workload, a single stream and the head-of-line test,
driven through the synchronous ``Engine`` (``step()`` in a loop, no server in between)."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from benchmarks.workload import BenchRequest, StreamRun, WorkloadRun, chat_prompt
from titan.loadgen.metrics import percentile

if TYPE_CHECKING:
    from benchmarks.workload import BenchSettings
    from titan.engine.engine import Engine
    from titan.engine.sampling_params import SamplingParams


def greedy(max_tokens: int) -> SamplingParams:
    from titan.engine.sampling_params import SamplingParams

    # ignore_eos: every system generates exactly max_tokens tokens, whatever the text says.
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def warm_up(engine: Engine, settings: BenchSettings, rng: random.Random) -> None:
    """A short prefill and a few decodes together, so one-time costs stay out of the timings."""
    short_len, long_len = settings.prompt_tokens[0], settings.prompt_tokens[0] * 4
    for i, length in enumerate((short_len, long_len)):
        prompt = chat_prompt(engine.tokenizer, length, rng)
        engine.add_request(f"warmup-{i}", prompt, greedy(settings.warmup_max_tokens))
    while engine.has_unfinished:
        engine.step()


def run_workload(engine: Engine, requests: Sequence[BenchRequest]) -> WorkloadRun:
    """All requests added at t=0, then ``step()`` until done. A request's first token counts
    when the step that produced it returns."""
    start = time.perf_counter()
    for request in requests:
        engine.add_request(request.request_id, request.prompt_token_ids, greedy(request.max_tokens))
    ttft_s: dict[str, float] = {}
    num_tokens = dict.fromkeys((r.request_id for r in requests), 0)
    while engine.has_unfinished:
        outputs = engine.step()
        now = time.perf_counter()
        for output in outputs:
            if output.token_ids and output.request_id not in ttft_s:
                ttft_s[output.request_id] = now - start
            num_tokens[output.request_id] += len(output.token_ids)
    wall_s = time.perf_counter() - start
    _check_lengths(num_tokens, {r.request_id: r.max_tokens for r in requests})
    return WorkloadRun("titan", wall_s, sum(num_tokens.values()), ttft_s)


def run_single_stream(
    engine: Engine, prompt_token_ids: list[int], num_new_tokens: int
) -> StreamRun:
    token_times: list[float] = []
    start = time.perf_counter()
    engine.add_request("single-stream", prompt_token_ids, greedy(num_new_tokens))
    while engine.has_unfinished:
        outputs = engine.step()
        now = time.perf_counter()
        token_times.extend(now for output in outputs for _ in output.token_ids)
    _check_lengths({"single-stream": len(token_times)}, {"single-stream": num_new_tokens})
    return StreamRun(
        system="titan",
        num_prompt_tokens=len(prompt_token_ids),
        num_generated_tokens=num_new_tokens,
        first_token_s=token_times[0] - start,
        last_token_s=token_times[-1] - start,
    )


def run_head_of_line(engine: Engine, settings: BenchSettings, rng: random.Random) -> dict[str, Any]:
    """Running decodes, then a long prompt arrives. The streams' inter-token gaps while they
    decode alone are their normal pace (the median); the gaps from the long prompt's arrival to
    its first token are what it costs them (the worst)."""
    stream_ids = [f"hol-stream-{i}" for i in range(settings.hol_num_streams)]
    long_id = "hol-long-prompt"
    for request_id in stream_ids:
        prompt = chat_prompt(engine.tokenizer, settings.hol_stream_prompt_tokens, rng)
        engine.add_request(request_id, prompt, greedy(settings.hol_stream_max_tokens))
    long_prompt = chat_prompt(engine.tokenizer, settings.hol_long_prompt_tokens, rng)

    record_from = settings.hol_tokens_before_arrival - settings.hol_tokens_recorded_before_arrival
    num_tokens = dict.fromkeys(stream_ids, 0)
    before: dict[str, list[float]] = {request_id: [] for request_id in stream_ids}
    during: dict[str, list[float]] = {request_id: [] for request_id in stream_ids}
    arrived_at = first_token_at = None
    num_steps_to_first_token = 0
    while first_token_at is None:
        if not engine.has_unfinished:
            raise RuntimeError("the head-of-line streams finished before the long prompt's token")
        outputs = engine.step()
        now = time.perf_counter()
        if arrived_at is not None:
            num_steps_to_first_token += 1  # this step computed (part of) the long prompt
        for output in outputs:
            if output.request_id == long_id:
                if output.token_ids:
                    first_token_at = now
                continue
            for _ in output.token_ids:
                num_tokens[output.request_id] += 1
                if arrived_at is not None:
                    during[output.request_id].append(now)
                elif num_tokens[output.request_id] > record_from:
                    before[output.request_id].append(now)
        if arrived_at is None and min(num_tokens.values()) >= settings.hol_tokens_before_arrival:
            arrived_at = time.perf_counter()
            engine.add_request(long_id, long_prompt, greedy(settings.hol_long_max_tokens))
    for request_id in [*stream_ids, long_id]:
        engine.abort_request(request_id)

    normal = sorted(g for rid in stream_ids for g in _gaps(before[rid]))
    # A stream's gap across the arrival counts as "during": it includes the first chunk's step.
    hit = sorted(g for rid in stream_ids for g in _gaps(before[rid][-1:] + during[rid]))
    median_gap = percentile(normal, 50)
    return {
        "num_streams": len(stream_ids),
        "stream_prompt_tokens": settings.hol_stream_prompt_tokens,
        "tokens_before_arrival": settings.hol_tokens_before_arrival,
        "long_prompt_tokens": len(long_prompt),
        "long_prompt_ttft_s": first_token_at - arrived_at,
        "num_steps_to_first_token": num_steps_to_first_token,
        "num_gaps": len(normal) + len(hit),
        "median_gap_s": median_gap,
        "median_gap_during_s": percentile(hit, 50),
        "worst_gap_s": hit[-1],
        "worst_over_median": hit[-1] / median_gap,
        "gaps_s": {"before": normal, "during": hit},
    }


def _gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def _check_lengths(actual: dict[str, int], expected: dict[str, int]) -> None:
    wrong = {rid: (actual.get(rid, 0), n) for rid, n in expected.items() if actual.get(rid) != n}
    if wrong:
        raise RuntimeError(f"generated token counts differ from max_tokens (got, want): {wrong}")
