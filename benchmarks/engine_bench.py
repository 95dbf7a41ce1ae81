"""``python -m benchmarks engine``: Titan's engine against HF ``generate`` on the same requests,
weights, dtype and torch threads, in one run on this machine.

Phases: (1) the workload (N chat requests, all arriving at t=0) through Titan, HF one request
at a time, and HF static padded batches; (2) single-stream decode speed; (3) head-of-line: the
inter-token gaps of running decodes while a long prompt arrives. torch and transformers are
imported inside functions: importing this module is cheap and has no side effects.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import hf_baseline, titan_runs
from benchmarks.server_load import run_server_load
from benchmarks.workload import (
    BenchRequest,
    BenchSettings,
    StreamRun,
    WorkloadRun,
    build_workload,
    chat_prompt,
)
from titan.loadgen.metrics import percentile


def run(settings: BenchSettings, progress: Callable[[str], None]) -> dict[str, Any]:
    """Measure every system; returns the raw results (JSON-ready)."""
    from titan.engine.config import EngineConfig

    # Dense weights, as HF runs them: this benchmark is about batching and scheduling on the
    # same arithmetic (benchmarks/llamacpp.py measures the quantized default).
    engine_kwargs: dict[str, Any] = {
        "dtype": settings.dtype,
        "quantization": "none",
        "num_threads": settings.num_threads,
    }
    if settings.kv_cache_bytes is not None:
        engine_kwargs["kv_cache_bytes"] = settings.kv_cache_bytes
    engine_config = EngineConfig(**engine_kwargs)

    titan = _run_titan(settings, engine_config, progress)
    hf = _run_hf(settings, titan, engine_config.resolved_num_threads(), progress)
    num_streams = settings.server_load.num_streams
    progress(f"titan serve: /health while {num_streams} streams keep the engine busy")
    server_load = run_server_load(
        _dtype_name(titan.dtype), engine_config.resolved_num_threads(), settings.server_load
    )
    return {
        "meta": {
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "dtype": _dtype_name(titan.dtype),
            "num_threads": engine_config.resolved_num_threads(),
        },
        "workload": _workload_summary(titan.requests),
        "systems": {
            run.system: _workload_result(run)
            for run in (titan.workload, hf.sequential, hf.static_batches)
        },
        "titan_engine_stats": titan.engine_stats,
        "single_stream": {
            "titan": _stream_result(titan.single_stream),
            "hf": _stream_result(hf.single_stream),
        },
        "head_of_line": titan.head_of_line,
        "titan_other_dtype": titan.other_dtype,
        "server_load": server_load,
        "targets": _targets(titan, hf, settings.batch_size, server_load),
    }


@dataclass
class _TitanPhase:
    dtype: Any  # torch.dtype the engine resolved; HF runs in the same one
    hf_dir: Path
    pad_token_id: int
    requests: list[BenchRequest]
    single_prompt: list[int]
    workload: WorkloadRun
    engine_stats: dict[str, Any]
    single_stream: StreamRun
    head_of_line: dict[str, Any]
    other_dtype: dict[str, Any] | None  # the workload again in float32, when auto chose bf16


@dataclass
class _HFPhase:
    sequential: WorkloadRun
    static_batches: WorkloadRun
    single_stream: StreamRun


def _run_titan(
    settings: BenchSettings, engine_config: Any, progress: Callable[[str], None]
) -> _TitanPhase:
    from titan.engine.engine import Engine
    from titan.engine.model.loader import resolve_model

    progress(
        f"loading Titan's engine (dtype={settings.dtype}, "
        f"threads={engine_config.resolved_num_threads()})"
    )
    engine = Engine(engine_config)
    tokenizer = engine.tokenizer
    requests = build_workload(
        tokenizer, settings.num_requests, settings.seed, settings.prompt_tokens, settings.max_tokens
    )
    # The other phases' prompts come from other seeds: they share no prefix-cache blocks with
    # the workload beyond the chat template's header.
    single_prompt = chat_prompt(
        tokenizer, settings.single_stream_prompt_tokens, random.Random(settings.seed + 1)
    )
    titan_runs.warm_up(engine, settings, random.Random(settings.seed + 2))

    progress(f"Titan: {len(requests)} requests at once")
    engine.reset_stats()
    workload = titan_runs.run_workload(engine, requests)
    engine_stats = asdict(engine.stats())
    progress("Titan: single stream")
    single_stream = titan_runs.run_single_stream(
        engine, single_prompt, settings.single_stream_new_tokens
    )
    progress(
        f"Titan: head-of-line ({settings.hol_num_streams} decodes, "
        f"a {settings.hol_long_prompt_tokens}-token prompt arrives)"
    )
    head_of_line = titan_runs.run_head_of_line(engine, settings, random.Random(settings.seed + 3))
    source = resolve_model(engine_config.model, engine_config.resolved_cache_dir() / "models")
    dtype = engine.dtype
    other_dtype = None
    if settings.dtype == "auto" and _dtype_name(dtype) != "float32":
        # The evidence for auto's choice: the same workload in float32, same run.
        del engine
        gc.collect()
        progress("Titan: the same workload in float32 (the dtype auto did not choose)")
        fp32 = Engine(replace(engine_config, dtype="float32"))
        titan_runs.warm_up(fp32, settings, random.Random(settings.seed + 2))
        other_dtype = _workload_result(titan_runs.run_workload(fp32, requests))
        other_dtype["dtype"] = "float32"
    return _TitanPhase(
        dtype=dtype,
        hf_dir=source.hf_dir,
        pad_token_id=tokenizer.eos_token_ids[0],
        requests=requests,
        single_prompt=single_prompt,
        workload=workload,
        engine_stats=engine_stats,
        single_stream=single_stream,
        head_of_line=head_of_line,
        other_dtype=other_dtype,
    )


def _run_hf(
    settings: BenchSettings, titan: _TitanPhase, num_threads: int, progress: Callable[[str], None]
) -> _HFPhase:
    import torch

    gc.collect()  # Titan's engine (KV cache, weights) is gone before HF loads its own copy
    progress(f"loading HF transformers (same weights, dtype={_dtype_name(titan.dtype)})")
    torch.set_num_threads(num_threads)
    model = hf_baseline.load_hf_model(titan.hf_dir, titan.dtype)
    pad_token_id = titan.pad_token_id
    hf_baseline.warm_up(model, pad_token_id)
    progress(f"HF generate: {len(titan.requests)} requests one at a time")
    sequential = hf_baseline.run_sequential(model, titan.requests, pad_token_id)
    progress(f"HF generate: static batches of {settings.batch_size}")
    static_batches = hf_baseline.run_static_batches(
        model, titan.requests, settings.batch_size, pad_token_id
    )
    progress("HF generate: single stream")
    single_stream = hf_baseline.run_single_stream(
        model, titan.single_prompt, settings.single_stream_new_tokens, pad_token_id
    )
    if torch.get_num_threads() != num_threads:
        raise RuntimeError(
            f"torch threads changed during the run: {num_threads} -> {torch.get_num_threads()}"
        )
    return _HFPhase(sequential, static_batches, single_stream)


def _workload_result(run: WorkloadRun) -> dict[str, Any]:
    ttfts = list(run.ttft_s.values())
    return {
        "wall_s": run.wall_s,
        "num_generated_tokens": run.num_generated_tokens,
        "tokens_per_s": run.tokens_per_s,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "ttft_s": run.ttft_s,
    }


def _stream_result(run: StreamRun) -> dict[str, Any]:
    return {**asdict(run), "decode_tokens_per_s": run.decode_tokens_per_s}


def _workload_summary(requests: Sequence[BenchRequest]) -> dict[str, Any]:
    return {
        "num_requests": len(requests),
        "arrival": "all at t=0",
        "sampling": "greedy, ignore_eos (exactly max_tokens tokens each)",
        "num_prompt_tokens": sum(r.num_prompt_tokens for r in requests),
        "num_generated_tokens": sum(r.max_tokens for r in requests),
        "requests": [
            {
                "request_id": r.request_id,
                "num_prompt_tokens": r.num_prompt_tokens,
                "max_tokens": r.max_tokens,
            }
            for r in requests
        ],
    }


def _target(
    name: str, value: float, target: float, is_minimum: bool, unit: str = "×"
) -> dict[str, Any]:
    passed = value >= target if is_minimum else value <= target
    return {
        "name": name,
        "value": value,
        "target": target,
        "unit": unit,
        "comparison": ">=" if is_minimum else "<=",
        "passed": passed,
    }


def _targets(
    titan: _TitanPhase, hf: _HFPhase, batch_size: int, server_load: dict[str, Any]
) -> list[dict[str, Any]]:
    titan_tokens_per_s = titan.workload.tokens_per_s
    return [
        _target(
            "aggregate tokens/s, Titan / HF one request at a time",
            titan_tokens_per_s / hf.sequential.tokens_per_s,
            6.0,
            is_minimum=True,
        ),
        _target(
            f"aggregate tokens/s, Titan / HF static batches of {batch_size}",
            titan_tokens_per_s / hf.static_batches.tokens_per_s,
            2.0,
            is_minimum=True,
        ),
        _target(
            "single-stream decode tokens/s, Titan / HF",
            titan.single_stream.decode_tokens_per_s / hf.single_stream.decode_tokens_per_s,
            1.0,
            is_minimum=True,
        ),
        _target(
            "head-of-line: worst inter-token gap / median gap",
            titan.head_of_line["worst_over_median"],
            3.0,
            is_minimum=False,
        ),
        _target(
            "/health p99 (ms) while the engine is saturated",
            server_load["under_load"]["p99_ms"],
            50.0,
            is_minimum=False,
            unit=" ms",
        ),
    ]


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")
