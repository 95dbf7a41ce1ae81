"""A capacity plan as tables of strings (for the console) and as a JSON-ready mapping."""

from __future__ import annotations

import math
from typing import Any

from titan.planning.plan import CapacityPlan, ReplicaTrial

GIB = 2**30
Table = tuple[list[str], list[list[str]]]


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:,.2f} GiB"


def _ms(seconds: float) -> str:
    return "–" if math.isnan(seconds) else f"{seconds * 1000:,.1f}"


def _params(count: int) -> str:
    return f"{count / 1e9:,.2f}B" if count >= 1e9 else f"{count / 1e6:,.1f}M"


def _inputs(plan: CapacityPlan) -> Table:
    request, model = plan.request, plan.request.model
    traffic, slo = request.traffic, request.slo
    params = _params(model.num_params)
    if model.moe is not None:
        params += f" ({_params(model.num_active_params)} active)"
    slos = [
        f"TTFT p{slo.percentile:g} ≤ {slo.ttft_ms:g} ms" if slo.ttft_ms else "",
        f"TPOT p{slo.percentile:g} ≤ {slo.tpot_ms:g} ms" if slo.tpot_ms else "",
    ]
    arrivals = "Poisson" if traffic.arrivals.cv == 1 else f"gamma, cv {traffic.arrivals.cv:g}"
    rows = [
        ["model", f"{model.name} ({params}, {model.source})"],
        ["GPU", f"{request.gpu.name} × {request.tensor_parallel} (tensor parallel)"],
        ["weights", request.weights.name],
        ["KV cache dtype", f"{request.kv_dtype_bytes} bytes per value"],
        [
            "traffic",
            f"{traffic.arrivals.rate:g} requests/s ({arrivals}), prompts "
            f"{traffic.prompt_tokens}, outputs {traffic.output_tokens}",
        ],
        ["SLO", ", ".join(s for s in slos if s) or "none (throughput only)"],
        ["step cost", plan.cost_model],
    ]
    return ["input", "value"], rows


def _memory(plan: CapacityPlan) -> Table:
    memory, request = plan.memory, plan.request
    rows = [
        ["weights (whole model)", _gib(memory.weight_bytes)],
        ["weights per GPU", _gib(memory.weight_bytes_per_gpu)],
        ["activations per GPU (peak estimate)", _gib(memory.activation_bytes_per_gpu)],
        ["runtime overhead per GPU", _gib(memory.runtime_overhead_bytes_per_gpu)],
        [
            f"usable per GPU ({request.gpu_memory_utilization:g} of "
            f"{_gib(request.gpu.memory_bytes)})",
            _gib(memory.usable_bytes_per_gpu),
        ],
        ["KV cache per GPU", _gib(max(memory.kv_bytes_per_gpu, 0))],
        ["KV bytes per token per GPU", f"{memory.kv_bytes_per_token_per_gpu:,}"],
        ["tokens of KV that fit (per replica)", f"{memory.num_kv_tokens:,}"],
        [
            f"sequences at the mean context ({plan.mean_context_tokens:,.0f} tokens)",
            f"{plan.max_batch:,} (max_num_seqs {request.max_num_seqs})",
        ],
    ]
    return ["memory", "value"], rows


def _roofline(plan: CapacityPlan) -> Table:
    rows = [
        [
            f"prefill, one {plan.request.traffic.prompt_tokens.mean:,.0f}-token prompt",
            f"{plan.prefill_tokens_per_s:,.0f}",
        ]
    ]
    rows += [
        [f"decode, batch {batch}, {plan.mean_context_tokens:,.0f}-token contexts", f"{rate:,.0f}"]
        for batch, rate in plan.decode_tokens_per_s
    ]
    rows.append(
        ["one replica's capacity (estimate, requests/s)", f"{plan.capacity_estimate_rps:,.2f}"]
    )
    return ["throughput", "tokens/s"], rows


def _trial_row(trial: ReplicaTrial) -> list[str]:
    summary = trial.summary
    return [
        str(trial.num_replicas),
        f"{trial.rate_per_replica:.3g}",
        _ms(summary.ttft_p50_s),
        _ms(trial.ttft_at_slo_s),
        _ms(summary.tpot_p50_s),
        _ms(trial.tpot_at_slo_s),
        f"{summary.mean_seqs_per_step:.1f}",
        "meets" if trial.is_enough else "; ".join(trial.failures),
    ]


def plan_tables(plan: CapacityPlan) -> dict[str, Table]:
    q = f"p{plan.request.slo.percentile:g}"
    tables = {"Inputs": _inputs(plan), "Memory": _memory(plan), "Roofline": _roofline(plan)}
    if plan.trials:
        header = [
            "replicas",
            "req/s each",
            "TTFT p50 (ms)",
            f"TTFT {q} (ms)",
            "TPOT p50 (ms)",
            f"TPOT {q} (ms)",
            "mean batch",
            "result",
        ]
        rows = [_trial_row(t) for t in plan.trials]
        tables["Simulated replicas"] = (header, rows)
    return tables


def verdict(plan: CapacityPlan) -> str:
    """One line: the replicas needed, or why there is no answer."""
    if plan.num_replicas is None:
        return f"No plan: {plan.note}."
    gpus = plan.num_replicas * plan.request.tensor_parallel
    return (
        f"Replicas needed: {plan.num_replicas} ({gpus} × {plan.request.gpu.name}) for "
        f"{plan.request.traffic.arrivals.rate:g} requests/s."
    )


def _number(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else value


def plan_to_dict(plan: CapacityPlan) -> dict[str, Any]:
    request, memory, model = plan.request, plan.memory, plan.request.model
    traffic = request.traffic
    return {
        "model": {
            "name": model.name,
            "source": model.source,
            "num_params": model.num_params,
            "num_active_params": model.num_active_params,
        },
        "gpu": request.gpu.name,
        "tensor_parallel": request.tensor_parallel,
        "weights": request.weights.name,
        "kv_dtype_bytes": request.kv_dtype_bytes,
        "traffic": {
            "rate": traffic.arrivals.rate,
            "arrivals_cv": traffic.arrivals.cv,
            "prompt_tokens": str(traffic.prompt_tokens),
            "output_tokens": str(traffic.output_tokens),
        },
        "slo": {
            "ttft_ms": request.slo.ttft_ms,
            "tpot_ms": request.slo.tpot_ms,
            "percentile": request.slo.percentile,
        },
        "memory": {
            "weight_bytes": memory.weight_bytes,
            "weight_bytes_per_gpu": memory.weight_bytes_per_gpu,
            "activation_bytes_per_gpu": memory.activation_bytes_per_gpu,
            "runtime_overhead_bytes_per_gpu": memory.runtime_overhead_bytes_per_gpu,
            "usable_bytes_per_gpu": memory.usable_bytes_per_gpu,
            "kv_bytes_per_gpu": memory.kv_bytes_per_gpu,
            "kv_bytes_per_token_per_gpu": memory.kv_bytes_per_token_per_gpu,
            "num_kv_tokens": memory.num_kv_tokens,
            "fits": memory.fits,
        },
        "cost_model": plan.cost_model,
        "prefill_tokens_per_s": plan.prefill_tokens_per_s,
        "decode_tokens_per_s": {str(b): rate for b, rate in plan.decode_tokens_per_s},
        "mean_context_tokens": plan.mean_context_tokens,
        "max_batch": plan.max_batch,
        "capacity_estimate_rps": plan.capacity_estimate_rps,
        "trials": [
            {
                "num_replicas": t.num_replicas,
                "rate_per_replica": t.rate_per_replica,
                "ttft_p50_s": _number(t.summary.ttft_p50_s),
                "ttft_at_slo_s": _number(t.ttft_at_slo_s),
                "tpot_p50_s": _number(t.summary.tpot_p50_s),
                "tpot_at_slo_s": _number(t.tpot_at_slo_s),
                "mean_seqs_per_step": t.summary.mean_seqs_per_step,
                "is_saturated": t.summary.is_saturated,
                "failures": list(t.failures),
            }
            for t in plan.trials
        ],
        "num_replicas": plan.num_replicas,
        "num_gpus": None
        if plan.num_replicas is None
        else plan.num_replicas * request.tensor_parallel,
        "min_tensor_parallel": plan.min_tensor_parallel,
        "note": plan.note,
    }
