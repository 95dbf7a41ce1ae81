"""``python -m benchmarks planner``: does the planner's simulator predict the embedded engine's
TTFT?

1. Calibrate: a grid of controlled steps (prefills alone, batches of decodes) and open-loop
   runs at the calibration rates; every step's shape and duration goes into a least-squares
   fit of the step cost model (titan/planning/calibration.py). The engine's own chunk-sizing
   model is read as it stands after these runs.
2. Predict, before measuring: the simulator replays each held-back rate's trace (the same seeded
   arrivals and lengths the engine will get) with the fitted cost model; also its long-run
   distribution at that rate, for comparison.
3. Measure: the engine replays those traces in real time (benchmarks/planner_runs.py).
4. Compare p50 and p99 TTFT: the target is within 25% at each held-back rate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from benchmarks import planner_runs as runs
from titan.planning.calibration import Calibration, StepSample, fit_step_cost
from titan.planning.sim_summary import percentile, summarize
from titan.planning.simulator import SchedulerSpec, SimResult, simulate
from titan.planning.step_cost import LinearStepCost
from titan.planning.traffic import Arrivals, LengthDistribution, TraceRequest, Traffic

STEADY_STATE_REQUESTS = 2000
SLOW_STEP = 1.5  # a step this many times the fitted model's time: interference
Progress = Callable[[str], None]


@dataclass(frozen=True)
class PlannerBenchSettings:
    prompt_tokens: str = "uniform:64,384"
    output_tokens: str = "uniform:16,96"
    calibration_rates: tuple[float, ...] = (0.8,)
    validation_rates: tuple[float, ...] = (0.5, 1.1, 1.6)
    calibration_duration_s: float = 50.0
    # The same count at every held-back rate, so that each p99 rests on as many requests.
    validation_num_requests: int = 100
    grid_prefill_lengths: tuple[int, ...] = (48, 96, 160, 256, 384, 512)
    grid_decode_batches: tuple[int, ...] = (1, 4, 8, 16, 32)
    grid_decode_prompt_tokens: int = 64
    grid_decode_max_tokens: int = 24
    seed: int = 0
    dtype: str = "auto"
    num_threads: int | None = None  # None: the engine's default, cores − 1
    kv_cache_bytes: int = 512 * 2**20
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> PlannerBenchSettings:
        """Every phase on a tiny scale (about a minute): a smoke run, not a measurement."""
        settings = cls(
            calibration_rates=(0.8,),
            validation_rates=(0.5, 1.0, 1.5),
            calibration_duration_s=6.0,
            validation_num_requests=5,
            grid_prefill_lengths=(48, 160, 384),
            grid_decode_batches=(1, 8),
            grid_decode_max_tokens=8,
            output_tokens="uniform:8,24",
            kv_cache_bytes=128 * 2**20,
            is_quick=True,
        )
        return replace(settings, **overrides)

    def traffic(self, rate: float, shared_prefix_tokens: int = 0) -> Traffic:
        return Traffic(
            Arrivals(rate),
            LengthDistribution.parse(self.prompt_tokens),
            LengthDistribution.parse(self.output_tokens),
            shared_prefix_tokens,
        )


def _run_inputs(
    settings: PlannerBenchSettings, engine: Any, rate: float, num_requests: int, index: int
) -> tuple[list[TraceRequest], list[list[int]]]:
    """A run's trace and prompts, from its own seed: no two runs (nor the grid) share arrivals
    or prompt text, so prefix-cache hits stay the shared chat header the simulator models."""
    seed = settings.seed * 1000 + index
    trace = settings.traffic(rate).trace(num_requests, seed=seed)
    return trace, runs.trace_prompts(engine, trace, seed)


def _ttft(values: Sequence[float]) -> dict[str, float]:
    return {
        "p50_s": percentile(list(values), 50),
        "p90_s": percentile(list(values), 90),
        "p99_s": percentile(list(values), 99),
    }


def _tpot(values: Sequence[float]) -> dict[str, float]:
    return {"p50_s": percentile(list(values), 50), "p99_s": percentile(list(values), 99)}


def _prediction(result: SimResult) -> dict[str, Any]:
    return {
        "ttft": _ttft(result.ttft_s),
        "tpot": _tpot(result.tpot_s),
        "num_steps": result.num_steps,
        "num_preemptions": result.num_preemptions,
    }


def _relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def run(settings: PlannerBenchSettings, progress: Progress) -> dict[str, Any]:
    """Calibrate, then validate at the held-back rates; the engine's shape joins the record."""
    from titan.engine.config import EngineConfig
    from titan.engine.engine import Engine

    config = EngineConfig(
        dtype=settings.dtype,
        num_threads=settings.num_threads,
        kv_cache_bytes=settings.kv_cache_bytes,
    )
    progress(
        f"loading the engine (dtype {settings.dtype}, {config.resolved_num_threads()} threads)"
    )
    engine = Engine(config)
    recorder = runs.StepRecorder(engine)
    runs.warm_up(engine)
    calibrated = _calibrate(engine, recorder, settings, progress)
    validation = _validate(engine, recorder, settings, calibrated, progress)
    fitted = calibrated.fitted
    return {
        "meta": {
            "engine": {
                "model": engine.model_name,
                "dtype": str(engine.dtype).removeprefix("torch."),
                "num_threads": config.resolved_num_threads(),
                "max_num_seqs": config.max_num_seqs,
                "max_num_batched_tokens": config.max_num_batched_tokens,
                "max_decode_slowdown": config.max_decode_slowdown,
                "num_kv_blocks": engine.kv.num_total_blocks,
                "block_size": config.block_size,
            },
        },
        "calibration": {
            "cost": fitted.cost.to_dict(),
            "engine_model": (
                None if calibrated.engine_model is None else calibrated.engine_model.to_dict()
            ),
            "num_samples": fitted.num_samples,
            "num_grid_samples": calibrated.num_grid_samples,
            "median_relative_error": fitted.median_relative_error,
            "p90_relative_error": fitted.p90_relative_error,
            "runs": calibrated.runs,
        },
        "validation": validation,
    }


@dataclass(frozen=True)
class _Calibrated:
    fitted: Calibration
    # The engine's own step model as it stood after calibration, for the record. The simulator
    # sizes chunks with the fitted cost instead: see _validate.
    engine_model: LinearStepCost | None
    num_grid_samples: int
    runs: list[dict[str, Any]]  # the calibration rates: predicted (in sample) vs measured


def _calibrate(
    engine: Any, recorder: runs.StepRecorder, settings: PlannerBenchSettings, progress: Progress
) -> _Calibrated:
    """The grid, then the calibration rates; every step goes into the fit."""
    progress("calibration: a grid of prefill and decode steps")
    samples: list[StepSample] = runs.run_grid(
        engine,
        recorder,
        settings.grid_prefill_lengths,
        settings.grid_decode_batches,
        settings.grid_decode_prompt_tokens,
        settings.grid_decode_max_tokens,
        settings.seed * 1000,
    )
    num_grid_samples = len(samples)
    measured = []
    for i, rate in enumerate(settings.calibration_rates):
        num_requests = max(4, round(rate * settings.calibration_duration_s))
        trace, prompts = _run_inputs(settings, engine, rate, num_requests, 100 + i)
        progress(f"calibration: {len(trace)} requests at {rate:g} requests/s")
        run = runs.run_open_loop(engine, recorder, rate, trace, prompts, f"cal-{i}")
        samples.extend(run.steps)
        measured.append((rate, trace, prompts, run))
    fitted = fit_step_cost(samples)
    engine_model = _engine_model(engine)
    cost = fitted.cost
    progress(
        f"fitted: {cost.fixed_s * 1e3:.1f} ms + {cost.per_token_s * 1e3:.3f} ms/token"
        f" + {cost.per_pair_s * 1e9:.0f} ns/pair + {cost.per_seq_s * 1e3:.3f} ms/seq"
        f" (median error {fitted.median_relative_error:.1%})"
    )
    rows = []
    for rate, trace, prompts, run in measured:
        spec = _scheduler_spec(engine, runs.shared_prefix_tokens(prompts))
        predicted = simulate(trace, cost, spec, cost)
        rows.append(_comparison(rate, trace, predicted, run, cost))
    return _Calibrated(fitted, engine_model, num_grid_samples, rows)


def _validate(
    engine: Any,
    recorder: runs.StepRecorder,
    settings: PlannerBenchSettings,
    calibrated: _Calibrated,
    progress: Progress,
) -> list[dict[str, Any]]:
    """Predictions first, for every held-back rate; then the measurements.

    Chunks are sized by the engine's rule at its equilibrium: the engine keeps refitting its
    step model and corrects mixed steps by their running actual/predicted ratio, so a chunk
    ends up making the step about ``max_decode_slowdown`` × the decodes alone by the true cost,
    which the fitted cost is. (A snapshot of the engine's model carries its bias of the moment,
    which swings by ±20% from step to step: measured on calibration runs, the fitted cost gives
    the engine's median chunk size, a snapshot did not.)"""
    cost = calibrated.fitted.cost
    planned = []
    for i, rate in enumerate(settings.validation_rates):
        num_requests = settings.validation_num_requests
        trace, prompts = _run_inputs(settings, engine, rate, num_requests, 200 + i)
        spec = _scheduler_spec(engine, runs.shared_prefix_tokens(prompts))
        predicted = simulate(trace, cost, spec, cost)
        steady = _steady_state(settings, rate, spec, cost)
        planned.append((rate, trace, prompts, predicted, steady))
    rows = []
    for i, (rate, trace, prompts, predicted, steady) in enumerate(planned):
        progress(f"validation: {len(trace)} requests at {rate:g} requests/s (held back)")
        run = runs.run_open_loop(engine, recorder, rate, trace, prompts, f"val-{i}")
        rows.append({**_comparison(rate, trace, predicted, run, cost), "steady_state": steady})
    return rows


def _engine_model(engine: Any) -> LinearStepCost | None:
    """The engine's own step model as it stands (it sizes chunks while decodes run)."""
    learned = engine.cost_model
    if learned.coefficients is None:
        return None
    fixed, per_token, per_pair = learned.coefficients
    return LinearStepCost(fixed, per_token, per_pair, 0.0, learned.mixed_step_bias)


def _scheduler_spec(engine: Any, shared_prefix_tokens: int) -> SchedulerSpec:
    config, scheduler = engine.config, engine.scheduler.config
    return SchedulerSpec(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        block_size=config.block_size,
        num_kv_blocks=engine.kv.num_total_blocks,
        max_decode_slowdown=config.max_decode_slowdown,
        max_prefill_chunk_while_decoding=config.max_prefill_chunk_while_decoding,
        min_prefill_chunk=scheduler.min_prefill_chunk,
        shared_prefix_tokens=shared_prefix_tokens if config.enable_prefix_caching else 0,
    )


def _steady_state(
    settings: PlannerBenchSettings, rate: float, spec: SchedulerSpec, cost: LinearStepCost
) -> dict[str, Any]:
    """The simulator's long-run TTFT at ``rate`` (another seed, many requests, 5% warm-up)."""
    traffic = settings.traffic(rate, spec.shared_prefix_tokens)
    trace = traffic.trace(STEADY_STATE_REQUESTS, seed=settings.seed * 1000 + 999)
    result = simulate(trace, cost, spec, cost)
    summary = summarize(result, warmup_fraction=0.05)
    return {
        "ttft": {
            "p50_s": summary.ttft_p50_s,
            "p90_s": summary.ttft_p90_s,
            "p99_s": summary.ttft_p99_s,
        },
        "tpot": {"p50_s": summary.tpot_p50_s, "p99_s": summary.tpot_p99_s},
        "mean_seqs_per_step": summary.mean_seqs_per_step,
        "is_saturated": summary.is_saturated,
    }


def _median_chunk(step_tokens: Sequence[int], step_seqs: Sequence[int]) -> float:
    """Prefill tokens per step that ran decodes and a chunk: tokens − sequences + 1 (exact with
    one chunk per step), the median. The same statistic for the engine and the simulation."""
    chunks = [t - s + 1 for t, s in zip(step_tokens, step_seqs, strict=True) if t > s > 1]
    return percentile(chunks, 50)


def _step_ratios(steps: Sequence[StepSample], cost: LinearStepCost) -> list[float]:
    """Each step's measured time over the fitted model's: the machine's speed during a run
    (after the fact: a diagnostic, never an input to the prediction)."""
    return [s.seconds / cost.seconds(s.num_tokens, s.num_seqs, s.num_pairs, 0) for s in steps]


def _slow_step_share(steps: Sequence[StepSample], cost: LinearStepCost) -> float:
    """Share of a run's steps that took over SLOW_STEP × the fitted model's time: the machine
    was busy with something else (the model's own p90 error is ~13%)."""
    ratios = _step_ratios(steps, cost)
    return sum(r > SLOW_STEP for r in ratios) / len(ratios) if ratios else 0.0


def _comparison(
    rate: float,
    trace: Sequence[TraceRequest],
    predicted: SimResult,
    run: runs.OpenLoopRun,
    cost: LinearStepCost,
) -> dict[str, Any]:
    measured = {"ttft": _ttft(run.ttft_s), "tpot": _tpot(run.tpot_s)}
    prediction = _prediction(predicted)
    errors = {
        q: _relative_error(prediction["ttft"][f"{q}_s"], measured["ttft"][f"{q}_s"])
        for q in ("p50", "p90", "p99")
    }
    return {
        "rate": rate,
        "num_requests": len(trace),
        "num_prompt_tokens": sum(r.num_prompt_tokens for r in trace),
        "num_output_tokens": sum(r.num_output_tokens for r in trace),
        "predicted": prediction,
        "measured": {
            **measured,
            "num_steps": len(run.steps),
            "wall_s": run.wall_s,
            "max_late_s": run.max_late_s,
            "slow_step_share": _slow_step_share(run.steps, cost),
            "step_time_vs_model": percentile(_step_ratios(run.steps, cost), 50),
            "other_cpu_cores": run.other_cpu_cores,
        },
        "median_chunk_while_decoding": {
            "predicted": _median_chunk(predicted.step_tokens, predicted.step_seqs),
            "measured": _median_chunk(
                [s.num_tokens for s in run.steps], [s.num_seqs for s in run.steps]
            ),
        },
        "ttft_relative_error": errors,
        # Per step of the engine: tokens, sequences, attention pairs, cached tokens, seconds.
        "steps": [
            [s.num_tokens, s.num_seqs, s.num_pairs, s.num_context_tokens, s.seconds]
            for s in run.steps
        ],
        # Per request: arrival (s), prompt and output tokens, predicted and measured TTFT (s).
        "requests": [
            [r.arrival_s, r.num_prompt_tokens, r.num_output_tokens, p, m]
            for r, p, m in zip(trace, predicted.ttft_s, run.ttft_s, strict=True)
        ],
    }
