"""A capacity plan: memory, roofline throughputs, and the replicas a traffic needs.

Replicas needed = the smallest N whose simulated replica, at rate / N, keeps up (its waiting
queue does not grow) and meets the SLOs (TTFT and TPOT at the SLO's percentile). The search
starts from an analytic estimate, doubles until a count passes, then bisects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from titan.planning.gpus import GpuSpec
from titan.planning.memory import MemoryPlan, WeightFormat, plan_memory
from titan.planning.models import ModelSpec
from titan.planning.roofline import RooflineStepCost
from titan.planning.sim_summary import SimSummary, percentile, summarize
from titan.planning.simulator import ChunkModel, SchedulerSpec, simulate
from titan.planning.step_cost import StepCost, attention_pairs
from titan.planning.traffic import Slo, Traffic

DECODE_BATCHES = (1, 8, 32, 128)
WARMUP_FRACTION = 0.1  # of each simulation's requests: it starts empty, a live replica does not
MAX_TENSOR_PARALLEL = 64


@dataclass(frozen=True)
class PlanRequest:
    model: ModelSpec
    gpu: GpuSpec
    weights: WeightFormat
    kv_dtype_bytes: int
    traffic: Traffic
    slo: Slo = field(default_factory=Slo)
    tensor_parallel: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_decode_slowdown: float | None = None  # the embedded engine's chunk rule (e.g. 2)
    num_requests: int = 1000  # per simulation
    seed: int = 0
    max_replicas: int = 1024
    cost: StepCost | None = None  # a calibrated step cost; None: the roofline
    chunk_model: ChunkModel | None = None


@dataclass(frozen=True)
class ReplicaTrial:
    num_replicas: int
    rate_per_replica: float
    summary: SimSummary
    ttft_at_slo_s: float  # at the SLO's percentile
    tpot_at_slo_s: float
    failures: tuple[str, ...]  # why it does not do (empty: it does)

    @property
    def is_enough(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class CapacityPlan:
    request: PlanRequest
    memory: MemoryPlan
    cost_model: str  # "roofline" or "calibrated"
    prefill_tokens_per_s: float  # one mean-length prompt alone
    decode_tokens_per_s: tuple[tuple[int, float], ...]  # (batch, tokens/s) at the mean context
    mean_context_tokens: float
    max_batch: int  # sequences that run together: max_num_seqs, or fewer if KV runs out
    capacity_estimate_rps: float  # one replica, analytic (the search's starting point)
    trials: tuple[ReplicaTrial, ...] = ()
    num_replicas: int | None = None
    note: str = ""
    min_tensor_parallel: int | None = None  # when it does not fit: the smallest TP that does

    @property
    def chosen(self) -> ReplicaTrial | None:
        return next((t for t in self.trials if t.num_replicas == self.num_replicas), None)


def _smallest_fitting_tp(request: PlanRequest) -> int | None:
    tp = 1
    while tp <= MAX_TENSOR_PARALLEL:
        memory = plan_memory(
            request.model,
            request.gpu,
            request.weights,
            request.kv_dtype_bytes,
            tp,
            request.gpu_memory_utilization,
            request.max_num_batched_tokens,
            request.max_num_seqs,
            request.block_size,
        )
        if memory.fits:
            return tp
        tp *= 2
    return None


def plan_capacity(request: PlanRequest) -> CapacityPlan:
    memory = plan_memory(
        request.model,
        request.gpu,
        request.weights,
        request.kv_dtype_bytes,
        request.tensor_parallel,
        request.gpu_memory_utilization,
        request.max_num_batched_tokens,
        request.max_num_seqs,
        request.block_size,
    )
    roofline = RooflineStepCost(
        request.model, request.gpu, request.weights, request.kv_dtype_bytes, request.tensor_parallel
    )
    cost: StepCost = request.cost if request.cost is not None else roofline
    traffic = request.traffic
    mean_prompt, mean_output = traffic.prompt_tokens.mean, traffic.output_tokens.mean
    context = mean_prompt + mean_output / 2
    prompt = max(1, round(mean_prompt))
    prefill = prompt / cost.seconds(prompt, 1, attention_pairs(0, prompt), prompt)
    decode = tuple((b, _decode_rate(cost, b, round(context))) for b in DECODE_BATCHES)
    max_batch = max(0, min(request.max_num_seqs, int(memory.num_kv_tokens // max(context, 1))))
    capacity = _capacity_estimate(
        cost, max(max_batch, 1), context, prefill, mean_prompt, mean_output
    )
    plan = CapacityPlan(
        request,
        memory,
        "calibrated" if request.cost else "roofline",
        prefill,
        decode,
        context,
        max_batch,
        capacity,
    )
    if not memory.fits:
        tp = _smallest_fitting_tp(request)
        hint = f"; tensor parallel {tp} fits" if tp else "; no tensor parallel size up to 64 fits"
        return _with(
            plan,
            note=f"the model does not fit on {request.gpu.name}"
            f" at tensor parallel {request.tensor_parallel}{hint}",
            min_tensor_parallel=tp,
        )
    unreachable = _unreachable_slo(request, _servable(traffic, request.model, memory), cost)
    if unreachable:
        return _with(plan, note=unreachable)
    return _search_replicas(plan, cost)


def _unreachable_slo(request: PlanRequest, traffic: Traffic, cost: StepCost) -> str:
    """Why no replica count meets the SLO (empty if one might): with no queueing at all, each
    prompt prefilled alone (in budget-sized chunks) and each sequence decoding alone."""
    slo = request.slo
    trace = traffic.trace(request.num_requests, request.seed)
    budget = request.max_num_batched_tokens
    ttfts, tpots = [], []
    for item in trace:
        seconds, start = 0.0, 0
        while start < item.num_prompt_tokens:
            n = min(budget, item.num_prompt_tokens - start)
            seconds += cost.seconds(n, 1, attention_pairs(start, n), start + n)
            start += n
        ttfts.append(seconds)
        context = item.num_prompt_tokens + item.num_output_tokens // 2
        tpots.append(cost.seconds(1, 1, context, context))
    q = slo.percentile
    ttft, tpot = percentile(ttfts, q), percentile(tpots, q)
    if slo.ttft_ms is not None and ttft * 1000 > slo.ttft_ms:
        return (
            f"no replica count meets the TTFT SLO: with no queueing at all, TTFT p{q:g} "
            f"is {ttft * 1000:.0f} ms > {slo.ttft_ms:g} ms"
        )
    if slo.tpot_ms is not None and tpot * 1000 > slo.tpot_ms:
        return (
            f"no replica count meets the TPOT SLO: decoding alone, TPOT p{q:g} is "
            f"{tpot * 1000:.1f} ms > {slo.tpot_ms:g} ms"
        )
    return ""


def _decode_rate(cost: StepCost, batch: int, context: int) -> float:
    total = batch * context
    return batch / cost.seconds(batch, batch, total, total)


def _capacity_estimate(
    cost: StepCost,
    batch: int,
    context: float,
    prefill_tps: float,
    mean_prompt: float,
    mean_output: float,
) -> float:
    """Requests/s of one replica running ``batch`` sequences: each needs its prompt prefilled
    and ``mean_output`` decode slots of a ``batch``-wide step."""
    step = cost.seconds(batch, batch, round(batch * context), round(batch * context))
    return 1.0 / (mean_output * step / batch + mean_prompt / prefill_tps)


def _with(plan: CapacityPlan, **changes: object) -> CapacityPlan:
    return replace(plan, **changes)  # type: ignore[arg-type]


def _servable(traffic: Traffic, model: ModelSpec, memory: MemoryPlan) -> Traffic:
    """Lengths past the context window (or the whole cache) could never run: prompts are
    clamped to 3/4 of it, outputs to 1/4."""
    limit = min(model.max_context, memory.num_kv_tokens)
    return Traffic(
        traffic.arrivals,
        traffic.prompt_tokens.with_maximum(max(1, limit * 3 // 4)),
        traffic.output_tokens.with_maximum(max(1, limit // 4)),
        traffic.shared_prefix_tokens,
    )


def _trial(plan: CapacityPlan, cost: StepCost, num_replicas: int) -> ReplicaTrial:
    request = plan.request
    rate = request.traffic.arrivals.rate / num_replicas
    traffic = _servable(request.traffic.at_rate(rate), request.model, plan.memory)
    spec = SchedulerSpec(
        max_num_seqs=request.max_num_seqs,
        max_num_batched_tokens=request.max_num_batched_tokens,
        block_size=request.block_size,
        num_kv_blocks=plan.memory.num_kv_tokens // request.block_size,
        max_decode_slowdown=request.max_decode_slowdown,
        shared_prefix_tokens=traffic.shared_prefix_tokens,
    )
    result = simulate(
        traffic.trace(request.num_requests, request.seed), cost, spec, request.chunk_model
    )
    summary = summarize(result, WARMUP_FRACTION)
    skip = int(len(result.ttft_s) * WARMUP_FRACTION)
    q = request.slo.percentile
    ttft, tpot = percentile(result.ttft_s[skip:], q), percentile(result.tpot_s[skip:], q)
    failures = []
    if summary.is_saturated:
        failures.append(f"the queue grows: {rate:.3g} requests/s is more than a replica serves")
    if request.slo.ttft_ms is not None and not ttft * 1000 <= request.slo.ttft_ms:
        failures.append(f"TTFT p{q:g} {ttft * 1000:.0f} ms > {request.slo.ttft_ms:g} ms")
    if request.slo.tpot_ms is not None and not tpot * 1000 <= request.slo.tpot_ms:
        failures.append(f"TPOT p{q:g} {tpot * 1000:.1f} ms > {request.slo.tpot_ms:g} ms")
    return ReplicaTrial(num_replicas, rate, summary, ttft, tpot, tuple(failures))


def _search_replicas(plan: CapacityPlan, cost: StepCost) -> CapacityPlan:
    request = plan.request
    trials: dict[int, ReplicaTrial] = {}

    def is_enough(n: int) -> bool:
        if n not in trials:
            trials[n] = _trial(plan, cost, n)
        return trials[n].is_enough

    rate = request.traffic.arrivals.rate
    start = max(
        1, min(request.max_replicas, math.ceil(rate / max(plan.capacity_estimate_rps, 1e-12)))
    )
    low, high = 0, start  # invariant: low is not enough (0 trivially), high is being tried
    while not is_enough(high):
        if high >= request.max_replicas:
            ordered = tuple(trials[n] for n in sorted(trials))
            return _with(
                plan, trials=ordered, note=f"not enough within {request.max_replicas} replicas"
            )
        low, high = high, min(2 * high, request.max_replicas)
    # Maybe fewer do: bisect between the last failure and the first success.
    while high - low > 1:
        middle = (low + high) // 2
        if is_enough(middle):
            high = middle
        else:
            low = middle
    ordered = tuple(trials[n] for n in sorted(trials))
    return _with(plan, trials=ordered, num_replicas=high)
