"""The embedded engine on a CUDA device, against the same engine on this machine's CPU in the same
run (``make gpu-check`` runs it after the CUDA-marked tests): one stream of 256 tokens and the
engine benchmark's 32 requests at once, engine alone (no HTTP), greedy with ``ignore_eos``.
"""

from __future__ import annotations

import time
from typing import Any

BENCHMARK = "engine-cuda"


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


def measure(device: str) -> dict[str, Any]:
    from benchmarks.workload import build_workload
    from titan.engine.sampling import SamplingParams

    engine = _engine(device)
    try:
        requests = build_workload(engine.tokenizer, 32, 0, (32, 1024), (16, 256))
        engine.add_request("warm", requests[0].prompt_token_ids, SamplingParams(max_tokens=8))
        _drain(engine)
        single = requests[1]
        engine.add_request(
            "single", single.prompt_token_ids,
            SamplingParams(max_tokens=256, temperature=0, ignore_eos=True),
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


def run() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: torch.cuda.is_available() is False")
    return {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": measure("cuda"),
        "cpu": measure("cpu"),
    }


def render_markdown(results: dict[str, Any], command: str) -> str:
    cuda, cpu = results["cuda"], results["cpu"]
    return "\n".join([
        f"<!-- {BENCHMARK}-bench:start -->",
        "## Embedded engine on CUDA (`make gpu-check`)",
        "",
        f"Measured with `{command}` on {results['gpu']} (torch {results['torch']}); the same "
        "engine on this machine's CPU in the same run as the baseline.",
        "",
        "| | CUDA | CPU |",
        "|---|---|---|",
        f"| runs | {cuda['runs']} | {cpu['runs']} |",
        f"| single stream, decode tokens/s | {cuda['single_decode_tokens_per_s']:.1f} | "
        f"{cpu['single_decode_tokens_per_s']:.1f} |",
        f"| 32 requests at once, tokens/s | {cuda['at_once_tokens_per_s']:.1f} | "
        f"{cpu['at_once_tokens_per_s']:.1f} |",
        "",
        f"<!-- {BENCHMARK}-bench:end -->",
    ])  # fmt: skip
