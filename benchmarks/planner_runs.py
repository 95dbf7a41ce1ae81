"""The planner benchmark's measurements on the embedded engine: every step's shape and duration,
a grid of controlled steps, and open-loop runs that replay a planner trace in real time.

The engine is driven as the AsyncEngine drives it (titan/engine/async_engine.py): requests that
arrived while a step ran are added before the next step; when idle, the loop waits for the next
arrival. One thread, no HTTP, so the times are the engine's own. torch is never imported here.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.workload import chat_prompt
from titan.planning.calibration import StepSample
from titan.planning.step_cost import attention_pairs
from titan.planning.traffic import TraceRequest

if TYPE_CHECKING:
    from titan.engine.engine import Engine
    from titan.engine.scheduler import SchedulerOutput


class StepRecorder:
    """Remembers what the engine's scheduler chose for the step about to run (a wrapper around
    this engine's ``scheduler.schedule``; nothing else changes), so a timed ``step()`` becomes a
    StepSample."""

    def __init__(self, engine: Engine):
        self._schedule = engine.scheduler.schedule
        self.last: SchedulerOutput | None = None
        engine.scheduler.schedule = self._record  # type: ignore[method-assign]

    def _record(self) -> SchedulerOutput:
        self.last = self._schedule()
        return self.last

    def sample(self, seconds: float) -> StepSample | None:
        scheduled = self.last.scheduled if self.last is not None else []
        if not scheduled:
            return None
        return StepSample(
            num_tokens=sum(s.num_new_tokens for s in scheduled),
            num_seqs=len(scheduled),
            num_pairs=sum(attention_pairs(s.start, s.num_new_tokens) for s in scheduled),
            num_context_tokens=sum(s.start + s.num_new_tokens for s in scheduled),
            seconds=seconds,
        )


def greedy(max_tokens: int) -> Any:
    from titan.engine.sampling_params import SamplingParams

    # ignore_eos: a request generates exactly its trace's output length, as simulated.
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def timed_step(engine: Engine, recorder: StepRecorder, samples: list[StepSample]) -> list[Any]:
    started = time.perf_counter()
    outputs = engine.step()
    sample = recorder.sample(time.perf_counter() - started)
    if sample is not None:
        samples.append(sample)
    return outputs


def warm_up(engine: Engine) -> None:
    """A prefill and a few decodes, so one-time costs stay out of every measurement."""
    prompt = chat_prompt(engine.tokenizer, 96, random.Random(-1))
    engine.add_request("warm-up", prompt, greedy(8))
    while engine.has_unfinished:
        engine.step()


def run_grid(
    engine: Engine,
    recorder: StepRecorder,
    prefill_lengths: Sequence[int],
    decode_batches: Sequence[int],
    decode_prompt_tokens: int,
    decode_max_tokens: int,
    seed: int,
) -> list[StepSample]:
    """Controlled steps: each prompt length alone (one prefill step, one token), then each batch
    size of decodes (their prefill and decode steps, contexts growing as they go)."""
    rng = random.Random(seed)
    samples: list[StepSample] = []
    for i, length in enumerate(prefill_lengths):
        engine.add_request(
            f"grid-prefill-{i}", chat_prompt(engine.tokenizer, length, rng), greedy(1)
        )
        while engine.has_unfinished:
            timed_step(engine, recorder, samples)
    for batch in decode_batches:
        for i in range(batch):
            prompt = chat_prompt(engine.tokenizer, decode_prompt_tokens, rng)
            engine.add_request(f"grid-decode-{batch}-{i}", prompt, greedy(decode_max_tokens))
        while engine.has_unfinished:
            timed_step(engine, recorder, samples)
    return samples


@dataclass
class OpenLoopRun:
    """One replay: per request (trace order) seconds from its scheduled arrival to its first
    token and the mean gap between its tokens; every step's sample."""

    rate: float
    ttft_s: list[float]
    tpot_s: list[float]
    steps: list[StepSample] = field(default_factory=list)
    wall_s: float = 0.0
    max_late_s: float = 0.0  # the latest any request was added after its arrival time
    # Cores other processes kept busy meanwhile, on average (None off Linux): on a shared
    # machine they slow the engine's steps.
    other_cpu_cores: float | None = None

    @property
    def num_requests(self) -> int:
        return len(self.ttft_s)


def _busy_cpu_seconds() -> float | None:
    """CPU time every process has spent so far, from /proc/stat (None off Linux)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def trace_prompts(engine: Engine, trace: Sequence[TraceRequest], seed: int) -> list[list[int]]:
    """Chat prompts of the trace's lengths (they share the chat template's header)."""
    rng = random.Random(seed)
    return [chat_prompt(engine.tokenizer, r.num_prompt_tokens, rng) for r in trace]


def shared_prefix_tokens(prompts: Sequence[Sequence[int]]) -> int:
    """The longest prefix every prompt starts with."""
    first = prompts[0]
    length = min(len(p) for p in prompts)
    for prompt in prompts[1:]:
        length = next((i for i in range(length) if prompt[i] != first[i]), length)
    return length


def run_open_loop(
    engine: Engine,
    recorder: StepRecorder,
    rate: float,
    trace: Sequence[TraceRequest],
    prompts: Sequence[list[int]],
    label: str,
) -> OpenLoopRun:
    """Replay ``trace`` in real time: request k is added at its arrival time (or when the step
    running then ends), its first token counts when the step that produced it returns."""
    run = OpenLoopRun(rate, [float("nan")] * len(trace), [float("nan")] * len(trace))
    first_token: dict[int, float] = {}
    num_generated = [0] * len(trace)
    ids = {f"{label}-{k}": k for k in range(len(trace))}
    next_request = 0
    busy_before, own_before = _busy_cpu_seconds(), _own_cpu_seconds()
    start = time.perf_counter()
    while next_request < len(trace) or engine.has_unfinished:
        now = time.perf_counter() - start
        while next_request < len(trace) and trace[next_request].arrival_s <= now:
            item = trace[next_request]
            run.max_late_s = max(run.max_late_s, now - item.arrival_s)
            request_id = f"{label}-{next_request}"
            engine.add_request(request_id, prompts[next_request], greedy(item.num_output_tokens))
            next_request += 1
        if not engine.has_unfinished:
            time.sleep(max(0.0, trace[next_request].arrival_s - (time.perf_counter() - start)))
            continue
        outputs = timed_step(engine, recorder, run.steps)
        now = time.perf_counter() - start
        for output in outputs:
            k = ids[output.request_id]
            num_generated[k] += len(output.token_ids)
            if output.token_ids and k not in first_token:
                first_token[k] = now
                run.ttft_s[k] = now - trace[k].arrival_s
            if output.is_finished:
                gaps = output.num_output_tokens - 1
                run.tpot_s[k] = (now - first_token[k]) / gaps if gaps else float("nan")
    run.wall_s = time.perf_counter() - start
    wrong = [k for k, item in enumerate(trace) if num_generated[k] != item.num_output_tokens]
    if wrong:  # the simulation assumes every request runs to its length
        raise RuntimeError(f"{len(wrong)} requests generated other than their output lengths")
    busy_after = _busy_cpu_seconds()
    if busy_before is not None and busy_after is not None:
        others = (busy_after - busy_before) - (_own_cpu_seconds() - own_before)
        run.other_cpu_cores = max(0.0, others) / run.wall_s
    return run
