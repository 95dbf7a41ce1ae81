"""The embedded engine on a CUDA device, against the same engine on this machine's CPU in the same
run (``make gpu-check`` runs it after the CUDA-marked tests): one stream of 256 tokens and the
engine benchmark's 32 requests at once, engine alone (no HTTP), greedy with ``ignore_eos``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.base import Benchmark
from benchmarks.results_file import quick_note

NAME = "engine-cuda"


@dataclass(frozen=True)
class Settings:
    num_requests: int = 32  # the engine benchmark's workload, at once
    single_tokens: int = 256  # one stream's decode
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> Settings:
        return replace(cls(num_requests=4, single_tokens=32, is_quick=True), **overrides)


def _engine(device: str) -> Any:
    from titan.engine.config import EngineConfig
    from titan.engine.engine import Engine

    return Engine(EngineConfig(device=device))


def _drain(engine: Any) -> tuple[int, float, dict[str, float]]:
    """Step until idle: (tokens generated, seconds, first-token time per request)."""
    started, generated, first = time.perf_counter(), 0, {}
    while engine.has_unfinished:
        for output in engine.step():
            generated += len(output.token_ids)
            if output.token_ids and output.request_id not in first:
                first[output.request_id] = time.perf_counter() - started
    return generated, time.perf_counter() - started, first


def measure(device: str, settings: Settings) -> dict[str, Any]:
    from benchmarks.workload import build_workload
    from titan.engine.sampling_params import SamplingParams

    engine = _engine(device)
    try:
        requests = build_workload(engine.tokenizer, settings.num_requests, 0, (32, 1024), (16, 256))
        engine.add_request("warm", requests[0].prompt_token_ids, SamplingParams(max_tokens=8))
        _drain(engine)
        single = requests[1]
        engine.add_request(
            "single", single.prompt_token_ids,
            SamplingParams(max_tokens=settings.single_tokens, temperature=0, ignore_eos=True),
        )  # fmt: skip
        tokens, seconds, first = _drain(engine)
        decode = (tokens - 1) / (seconds - first["single"])
        for request in requests:
            params = SamplingParams(max_tokens=request.max_tokens, temperature=0, ignore_eos=True)
            engine.add_request(request.request_id, request.prompt_token_ids, params)
        tokens, seconds, _ = _drain(engine)
        return {
            "device": device,
            "runs": engine.built.description,
            "single_decode_tokens_per_s": decode,
            "at_once_tokens_per_s": tokens / seconds,
        }
    finally:
        engine.close()


def run(settings: Settings, progress: Callable[[str], None]) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: torch.cuda.is_available() is False")
    gpu = torch.cuda.get_device_name(0)
    progress(f"the engine on {gpu}")
    on_cuda = measure("cuda", settings)
    progress("the engine on this CPU")
    return {"meta": {"machine": {"gpu": gpu}}, "cuda": on_cuda, "cpu": measure("cpu", settings)}


def render_markdown(results: dict[str, Any], json_name: str = "") -> str:
    meta, cuda, cpu = results["meta"], results["cuda"], results["cpu"]
    return "\n".join([
        f"<!-- {NAME}-bench:start -->",
        "## Embedded engine on CUDA (`make gpu-check`)",
        "",
        *quick_note(meta),
        f"Measured {meta['started_at']} with `{meta['command']}` on {meta['machine']['gpu']} "
        f"(torch {meta['versions']['torch']}); the same engine on this machine's CPU in the "
        "same run as the baseline.",
        "",
        "| | CUDA | CPU |",
        "|---|---|---|",
        f"| runs | {cuda['runs']} | {cpu['runs']} |",
        f"| single stream, decode tokens/s | {cuda['single_decode_tokens_per_s']:.1f} | "
        f"{cpu['single_decode_tokens_per_s']:.1f} |",
        f"| {meta['settings']['num_requests']} requests at once, tokens/s | "
        f"{cuda['at_once_tokens_per_s']:.1f} | {cpu['at_once_tokens_per_s']:.1f} |",
        "",
        *([f"Raw numbers: `{json_name}`.", ""] if json_name else []),
        f"<!-- {NAME}-bench:end -->",
    ])  # fmt: skip


BENCHMARK = Benchmark(NAME, run, render_markdown, packages=("torch", "titan"))
