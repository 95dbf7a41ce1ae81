"""``titan plan``: capacity planning (``python -m benchmarks planner`` checks its simulator
against the embedded engine). Bad input ends with one line on stderr and exit code 2."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from titan.errors import TitanError

DEFAULT_MODEL = "Llama-3.1-8B"
DEFAULT_GPU = "H100"


class PlanInputError(Exception):
    """A flag the planner cannot use; the message says which and why."""


def _fail(message: str) -> typer.Exit:
    typer.echo(f"titan plan: {message}", err=True)
    return typer.Exit(2)


def load_cost_model(path: Path) -> Any:
    """A calibrated LinearStepCost: ``python -m benchmarks planner``'s JSON (its calibration's
    cost) or a bare mapping of coefficients."""
    import orjson

    from titan.planning.step_cost import LinearStepCost

    try:
        data = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise PlanInputError(f"--cost-model {path}: cannot read: {exc.strerror}") from None
    except orjson.JSONDecodeError:
        raise PlanInputError(f"--cost-model {path}: not valid JSON") from None
    calibration = data.get("calibration", data) if isinstance(data, dict) else None
    if not isinstance(calibration, dict):
        raise PlanInputError(f"--cost-model {path}: expected a JSON object")
    try:
        return LinearStepCost.from_dict(calibration.get("cost", calibration))
    except ValueError as exc:
        raise PlanInputError(f"--cost-model {path}: {exc}") from None


def _request(options: dict[str, Any]) -> Any:
    """The PlanRequest the flags describe; raises PlanInputError, ConfigError or ValueError."""
    from titan.planning.gpus import gpu_by_name
    from titan.planning.memory import kv_dtype_bytes, weight_format
    from titan.planning.model_files import resolve_model
    from titan.planning.plan import PlanRequest
    from titan.planning.traffic import Arrivals, LengthDistribution, Slo, Traffic

    model = resolve_model(options["model"])
    if options["gpu"].strip().lower() == "cpu":
        gpu = _this_cpu(options["cpu_cores"])
    else:
        gpu = gpu_by_name(options["gpu"])
    if gpu is None:
        raise PlanInputError(f"unknown GPU {options['gpu']!r}: see --list-gpus")
    weights = weight_format(options["dtype"], model)
    try:
        prompts = LengthDistribution.parse(options["prompt_tokens"])
        outputs = LengthDistribution.parse(options["output_tokens"])
    except ValueError as exc:
        raise PlanInputError(f"--prompt-tokens/--output-tokens: {exc}") from None
    slowdown = options["max_decode_slowdown"]
    if slowdown is not None and not slowdown > 1:
        raise PlanInputError(f"--max-decode-slowdown must be > 1, got {slowdown:g}")
    cost = None
    if options["cost_model"] is not None:
        cost = load_cost_model(options["cost_model"])
    traffic = Traffic(
        Arrivals(options["rate"], options["arrival_cv"]),
        prompts,
        outputs,
        options["shared_prefix_tokens"],
    )
    return PlanRequest(
        model=model,
        gpu=gpu,
        weights=weights,
        kv_dtype_bytes=kv_dtype_bytes(options["kv_dtype"], weights),
        traffic=traffic,
        slo=Slo(options["slo_ttft_ms"], options["slo_tpot_ms"], options["slo_percentile"]),
        tensor_parallel=options["tensor_parallel"],
        max_num_seqs=options["max_num_seqs"],
        max_num_batched_tokens=options["max_num_batched_tokens"],
        gpu_memory_utilization=options["gpu_memory_utilization"],
        max_decode_slowdown=options["max_decode_slowdown"],
        num_requests=options["num_requests"],
        seed=options["seed"],
        cost=cost,
        chunk_model=cost,  # the engine's chunk rule at its equilibrium (capacity-planning.md)
    )


def _this_cpu(num_cores: int | None) -> Any:
    """``cpu``: this machine's cores (or ``num_cores``) and physical memory."""
    from titan.planning.gpus import cpu_spec

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return cpu_spec(num_cores or os.cpu_count() or 1, memory_bytes=memory)


def _print_list(kind: str, console: Any, as_json: bool) -> None:
    from titan.planning.gpus import GPUS
    from titan.planning.memory import kv_bytes_per_token
    from titan.planning.model_catalog import BUILT_IN_MODELS

    if kind == "models":
        header = [
            "model",
            "layers",
            "hidden",
            "heads / KV heads",
            "attention",
            "params",
            "active",
            "context",
            "KV bytes/token (bf16)",
        ]
        rows = [
            [
                m.name,
                str(m.num_layers),
                str(m.hidden_size),
                f"{m.num_heads} / {m.num_kv_heads}",
                "MLA" if m.mla else "GQA" if m.num_kv_heads < m.num_heads else "MHA",
                f"{m.num_params / 1e9:.2f}B",
                f"{m.num_active_params / 1e9:.2f}B",
                f"{m.max_context:,}",
                f"{kv_bytes_per_token(m, 2):,}",
            ]
            for m in BUILT_IN_MODELS
        ]
    else:
        header = ["gpu", "memory (GB)", "bandwidth (TB/s)", "bf16 TFLOPS", "fp8 TFLOPS", "note"]
        gpus = [*GPUS, _this_cpu(None)]
        rows = [
            [
                g.name,
                f"{g.memory_bytes / 1e9:.0f}",
                f"{g.memory_bandwidth / 1e12:.3g}",
                f"{g.bf16_flops / 1e12:.3g}",
                f"{g.fp8_flops / 1e12:.3g}" if g.fp8_flops else "–",
                g.note,
            ]
            for g in gpus
        ]
    if as_json:
        import orjson

        typer.echo(orjson.dumps([dict(zip(header, row, strict=True)) for row in rows]).decode())
        return
    from titan.cli.tables import print_tables

    print_tables({f"Built-in {'models' if kind == 'models' else 'GPUs'}": (header, rows)}, console)


def plan(
    model: Annotated[
        str, typer.Option(help="A built-in name (--list-models), a config.json or a .gguf file.")
    ] = DEFAULT_MODEL,
    gpu: Annotated[str, typer.Option(help="A GPU (--list-gpus) or cpu.")] = DEFAULT_GPU,
    tensor_parallel: Annotated[
        int, typer.Option("--tensor-parallel", "--num-gpus", min=1, help="GPUs per replica.")
    ] = 1,
    dtype: Annotated[
        str,
        typer.Option(
            help="Weights: auto (a GGUF's own format, else bf16), "
            "bf16, fp16, fp8, int8, int4/awq/gptq, fp32, q4_0, "
            "q4_1, q4_k, q5_k, q6_k, q8_0..."
        ),
    ] = "auto",
    kv_dtype: Annotated[
        str, typer.Option(help="KV cache: auto (16-bit), bf16, fp16, fp8, fp32.")
    ] = "auto",
    rate: Annotated[float, typer.Option(help="Requests per second, all replicas (> 0).")] = 1.0,
    prompt_tokens: Annotated[
        str,
        typer.Option(
            help="512, uniform:100,1000, normal:512,128, "
            "lognormal:MEDIAN,SIGMA or exponential:MEAN."
        ),
    ] = "512",
    output_tokens: Annotated[str, typer.Option(help="Like --prompt-tokens.")] = "256",
    arrival_cv: Annotated[
        float,
        typer.Option(min=0.0, help="Inter-arrival coefficient of variation: 1 Poisson, >1 bursty."),
    ] = 1.0,
    shared_prefix_tokens: Annotated[
        int, typer.Option(min=0, help="Prompt tokens every request shares (prefix-cached).")
    ] = 0,
    slo_ttft_ms: Annotated[float | None, typer.Option(min=0.0, help="TTFT target.")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(min=0.0, help="TPOT target.")] = None,
    slo_percentile: Annotated[
        float, typer.Option(min=1.0, max=100.0, help="Percentile the SLOs hold at.")
    ] = 99.0,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Sequences per step.")] = 256,
    max_num_batched_tokens: Annotated[int, typer.Option(min=1, help="Tokens per step.")] = 8192,
    gpu_memory_utilization: Annotated[
        float,
        typer.Option(help="Share of each GPU's memory the server may use, in (0, 1]."),
    ] = 0.9,
    max_decode_slowdown: Annotated[
        float | None,
        typer.Option(
            help="The embedded engine's chunk rule (> 1; it uses 2); default: the token budget "
            "only, as vLLM schedules.",
        ),
    ] = None,
    cost_model: Annotated[
        Path | None,
        typer.Option(
            help="A calibrated step cost (`python -m benchmarks planner`'s JSON) instead of "
            "the roofline."
        ),
    ] = None,
    cpu_cores: Annotated[
        int | None, typer.Option(min=1, help="Cores of --gpu cpu (default: this machine's).")
    ] = None,
    num_requests: Annotated[int, typer.Option(min=10, help="Requests per simulation.")] = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the simulated traffic.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    list_models: Annotated[
        bool, typer.Option("--list-models", help="The built-in models.")
    ] = False,
    list_gpus: Annotated[bool, typer.Option("--list-gpus", help="The GPU table.")] = False,
) -> None:
    """Capacity plan: weight and KV memory, roofline throughput, and the replicas a traffic
    needs to meet its SLOs (a simulation of continuous batching)."""
    options = dict(locals())  # the flags, by name
    from rich.console import Console

    console = Console()
    if list_models or list_gpus:
        _print_list("models" if list_models else "gpus", console, as_json)
        return
    try:
        request = _request(options)
        from titan.planning.plan import plan_capacity

        capacity = plan_capacity(request)
    except (PlanInputError, ValueError) as exc:
        raise _fail(str(exc)) from None
    except TitanError as exc:
        raise _fail(exc.message) from None
    from titan.planning.plan_report import plan_tables, plan_to_dict, verdict

    if as_json:
        import orjson

        typer.echo(orjson.dumps(plan_to_dict(capacity)).decode())
        return
    from titan.cli.tables import print_tables

    print_tables(plan_tables(capacity), console)
    console.print(verdict(capacity))
