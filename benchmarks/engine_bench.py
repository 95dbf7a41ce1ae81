"""``python -m benchmarks engine``: Titan's engine against HF ``generate`` on the same requests,
weights, dtype and torch threads, in one run on this machine.

Phases: (1) the workload (N chat requests, all arriving at t=0) through Titan, HF one request
at a time, and HF static padded batches; (2) single-stream decode speed; (3) head-of-line: the
inter-token gaps of running decodes while a long prompt arrives. torch and transformers are
imported inside functions: importing this module is cheap and has no side effects.
"""

from __future__ import annotations

import gc
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import hf_baseline, titan_runs
from benchmarks.server_load import ServerLoadSettings, run_server_load
from benchmarks.workload import (
    BenchRequest,
    StreamRun,
    WorkloadRun,
    build_workload,
    chat_prompt,
)
from titan.loadgen.metrics import percentile

DEFAULT_OUTPUT = Path("bench/RESULTS.md")
# Titan's engine runs with the server's defaults (EngineConfig) but for dtype and threads; the
# quick run also shrinks the KV cache, which it barely uses, to spare a shared machine's memory.
_QUICK_KV_CACHE_BYTES = 256 * 1024**2


@dataclass(frozen=True)
class BenchSettings:
    num_requests: int = 32
    seed: int = 0
    dtype: str = "auto"
    num_threads: int | None = None  # None: EngineConfig's default, cores - 1
    prompt_tokens: tuple[int, int] = (32, 1024)
    max_tokens: tuple[int, int] = (16, 256)
    batch_size: int = 8  # HF static batches
    single_stream_prompt_tokens: int = 128
    single_stream_new_tokens: int = 256
    hol_num_streams: int = 8
    hol_stream_prompt_tokens: int = 64
    hol_stream_max_tokens: int = 256
    hol_tokens_before_arrival: int = 32  # the long prompt arrives once every stream has these
    hol_tokens_recorded_before_arrival: int = 16
    hol_long_prompt_tokens: int = 2000
    hol_long_max_tokens: int = 8
    warmup_max_tokens: int = 8
    server_load: ServerLoadSettings = field(default_factory=ServerLoadSettings)
    kv_cache_bytes: int | None = None  # None: the engine's default
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> BenchSettings:
        """A tiny run (well under a minute) that exercises every phase; used by the tests."""
        settings = cls(
            num_requests=4,
            prompt_tokens=(24, 64),
            max_tokens=(4, 16),
            batch_size=2,  # two batches, so that waiting for an earlier batch is exercised
            single_stream_prompt_tokens=64,
            single_stream_new_tokens=16,
            hol_num_streams=2,
            hol_stream_prompt_tokens=32,
            hol_stream_max_tokens=48,
            hol_tokens_before_arrival=8,
            hol_tokens_recorded_before_arrival=4,
            hol_long_prompt_tokens=200,
            hol_long_max_tokens=4,
            warmup_max_tokens=4,
            server_load=ServerLoadSettings(
                num_streams=4, prompt_words=20, max_tokens=8, num_idle_probes=10
            ),
            kv_cache_bytes=_QUICK_KV_CACHE_BYTES,
            is_quick=True,
        )
        return replace(settings, **overrides)


@dataclass(frozen=True)
class BenchOutcome:
    results: dict[str, Any]
    markdown_path: Path
    json_path: Path


def bench_engine(
    settings: BenchSettings,
    output: Path = DEFAULT_OUTPUT,
    command: str | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> BenchOutcome:
    """Run every phase, then write the Markdown section into ``output`` and the raw numbers to
    ``output``'s folder / out / engine-<timestamp>.json."""
    from benchmarks import engine_report as report

    results = run_engine_bench(settings, command=command, progress=progress)
    json_path = report.write_json(report.json_path_for(output.parent / "out"), results)
    markdown = report.render_markdown(results, json_name=report.display_path(json_path))
    return BenchOutcome(results, report.write_section(output, markdown), json_path)


def run_engine_bench(
    settings: BenchSettings,
    command: str | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
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
    started_at = datetime.now(UTC)
    # Other work on the machine skews every number: the load average says how busy it was.
    load_before = os.getloadavg()[0]

    titan = _run_titan(settings, engine_config, progress)
    hf = _run_hf(settings, titan, engine_config.resolved_num_threads(), progress)
    num_streams = settings.server_load.num_streams
    progress(f"titan serve: /health while {num_streams} streams keep the engine busy")
    server_load = run_server_load(
        _dtype_name(titan.dtype), engine_config.resolved_num_threads(), settings.server_load
    )
    return {
        "meta": _meta(
            settings,
            command,
            started_at,
            titan.dtype,
            engine_config.resolved_num_threads(),
            load_before,
        ),
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


def _meta(
    settings: BenchSettings,
    command: str | None,
    started_at: datetime,
    dtype: Any,
    num_threads: int,
    load_before: float,
) -> dict[str, Any]:
    from benchmarks import engine_report as report

    return {
        "command": command or report.default_command(),
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": report.machine_info(load_before),
        "versions": report.versions(),
        "dtype": _dtype_name(dtype),
        "num_threads": num_threads,
        "settings": asdict(settings),
    }
