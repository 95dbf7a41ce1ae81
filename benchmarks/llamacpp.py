"""Titan's embedded engine against llama.cpp's ``llama-server`` on this CPU, side by side in one
run: both serve the same GGUF file, both are reached over their OpenAI-compatible HTTP APIs by
the same client (benchmarks/llamacpp_load.py), one at a time.

Phases, for each server: one stream of 256 tokens (decode speed), the engine benchmark's 32
requests arriving at once (aggregate tokens/s, TTFT, peak memory), one prompt of ~4,700 tokens
(time to first token), and a 20-turn conversation adding ~650 tokens a turn (Titan through
/v1/responses at its default window and at --max-model-len 2048, and once more, not a target,
with conversations kept to the whole default window where a CPU keeps 4,096; llama-server through
/v1/chat/completions with the whole history, as its clients send it). Last, what Titan's context
shift (trimmed turns' KV moved, not recomputed) changes in answers, in process
(benchmarks/context_shift_quality.py).
"""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks import context_shift_quality
from benchmarks.llama_server import (
    LLAMA_CPP_PYTHON,
    llama_server_binary,
    llama_server_version,
    start_llama_server,
)
from benchmarks.llamacpp_load import (
    Server,
    chat_conversation,
    conversation_turns,
    decode_rate,
    median,
    peak_rss_mib,
    run_at_once,
    run_one,
    titan_conversation,
)
from benchmarks.titan_server import start_titan, titan_environment
from benchmarks.workload import BenchRequest, build_workload, chat_prompt
from titan.chaos.processes import Services, stop

CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
             "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "asimddp", "sve")  # fmt: skip


@dataclass(frozen=True)
class Settings:
    seed: int = 0
    num_at_once: int = 32
    prompt_tokens: tuple[int, int] = (32, 1024)
    max_tokens: tuple[int, int] = (16, 256)
    single_prompt_tokens: int = 128
    single_new_tokens: int = 256
    single_repeats: int = 3
    long_prompt_tokens: int = 4700
    long_repeats: int = 2
    num_turns: int = 20
    turn_tokens: int = 650
    turn_output_tokens: int = 32
    # Titan's conversations at each window, each its own text: its targets take the median of
    # their last-turn ratios (one run's ratio moved 1.2-2.4x on a noisy 2-core VM)
    conversation_runs: int = 3
    small_window: int = 2048
    llama_context: int = 65536  # shared by llama-server's 32 slots (-kvu)
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> Settings:
        settings = cls(num_at_once=8, prompt_tokens=(32, 256), max_tokens=(8, 32),
                       single_new_tokens=32, single_repeats=1, long_prompt_tokens=1200,
                       long_repeats=1, num_turns=4, turn_tokens=200, turn_output_tokens=8,
                       conversation_runs=1, small_window=1024, llama_context=16384,
                       is_quick=True)  # fmt: skip
        return replace(settings, **overrides)


# Titan once more at its default window with conversations kept to that window (more than any
# window here: the window caps it), where by default a CPU keeps 4,096 tokens: not a target, the
# cost of the longer history, reported beside the targets.
FULL_CONVERSATION = "titan-full-conversation"
FULL_CONVERSATION_ENV = {"TITAN_CONTEXT__CONVERSATION_WINDOW": "1048576"}


@dataclass(frozen=True)
class Workloads:
    """What every server gets; the single streams, long prompts and conversations are drawn
    anew for each server (``for_server``), from the same distributions."""

    at_once: list[BenchRequest]
    singles: list[BenchRequest]
    longs: list[BenchRequest]
    turns: list[list[str]]

    def for_server(self, index: int, settings: Settings) -> Workloads:
        per_single, per_long = settings.single_repeats + 1, settings.long_repeats
        runs = settings.conversation_runs
        return Workloads(
            self.at_once,
            self.singles[index * per_single : (index + 1) * per_single],
            self.longs[index * per_long : (index + 1) * per_long],
            self.turns[index * runs : (index + 1) * runs],
        )


def build_workloads(settings: Settings) -> Workloads:
    from titan.engine.config import EngineConfig
    from titan.engine.model.loader import load_config, resolve_model
    from titan.engine.tokenizer import Tokenizer

    source = resolve_model(None, EngineConfig().resolved_cache_dir() / "models")
    config = load_config(source.hf_dir)
    tokenizer = Tokenizer(source.hf_dir, config.eos_token_ids, config.bos_token_id)
    at_once = build_workload(
        tokenizer, settings.num_at_once, settings.seed, settings.prompt_tokens,
        settings.max_tokens,
    )  # fmt: skip
    rng = random.Random(settings.seed + 1)
    # A new prompt per repeat and per server: no answer may come from a cache (Titan's response
    # cache keeps greedy answers; both servers keep prompt prefixes).
    singles = [
        BenchRequest(f"single-{i}", chat_prompt(tokenizer, settings.single_prompt_tokens, rng),
                     settings.single_new_tokens)
        for i in range(3 * (settings.single_repeats + 1))
    ]  # fmt: skip
    longs = [
        BenchRequest(f"long-{i}", chat_prompt(tokenizer, settings.long_prompt_tokens, rng), 4)
        for i in range(3 * settings.long_repeats)
    ]
    turns = [
        conversation_turns(settings.seed + i, settings.num_turns, settings.turn_tokens)
        for i in range(4 * settings.conversation_runs)
    ]
    return Workloads(at_once, singles, longs, turns)


def measure(server: Server, work: Workloads, settings: Settings, say: Any) -> dict[str, Any]:
    say(f"{server.name}: warm-up, then one stream of {settings.single_new_tokens} tokens")
    run_one(server, replace(work.singles[0], max_tokens=8))
    singles = [run_one(server, request) for request in work.singles[1:]]
    say(f"{server.name}: {len(work.at_once)} requests at once")
    at_once = run_at_once(server, work.at_once)
    rss = peak_rss_mib(server.pid)
    say(f"{server.name}: prompts of {settings.long_prompt_tokens} tokens")
    longs = [run_one(server, request) for request in work.longs]
    return {
        "single_decode_tokens_per_s": median([decode_rate(s) for s in singles]),
        "single_ttft_s": median([s.ttft_s or 0.0 for s in singles]),
        "at_once": at_once,
        "peak_rss_mib": rss,
        "long_ttft_s": median([s.ttft_s or 0.0 for s in longs]),
        "long_prompt_tokens": settings.long_prompt_tokens,
    }


def conversation_summary(turns: list[dict[str, Any]]) -> dict[str, Any]:
    """First and last answered turns' TTFT; ``refused``: why a later turn got no answer."""
    answered = [turn for turn in turns if "ttft_s" in turn]
    first, last = answered[0]["ttft_s"], answered[-1]["ttft_s"]
    refused = next((turn["refused"] for turn in turns if "refused" in turn), None)
    return {"turns": answered, "first_ttft_s": first, "last_ttft_s": last, "ratio": last / first,
            "num_answered": len(answered), "refused": refused}  # fmt: skip


def with_runs(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The first conversation's summary (its turns fill the report's table), with every run's
    last-turn ratio and their median."""
    ratios = [summary["ratio"] for summary in summaries]
    return {**summaries[0], "run_ratios": ratios, "median_ratio": median(ratios)}


def run(settings: Settings, progress: Callable[[str], None]) -> dict[str, Any]:
    """Both servers in a work folder of their own; the CPU's instruction sets and llama-server's
    version join the record."""
    with tempfile.TemporaryDirectory(prefix="titan-bench-") as work_dir:
        return _run(settings, Path(work_dir), progress)


def _run(settings: Settings, work_dir: Path, say: Callable[[str], None]) -> dict[str, Any]:
    work = build_workloads(settings)
    binary = llama_server_binary(say)
    gguf = _default_gguf()
    threads = os.cpu_count() or 1
    results: dict[str, Any] = {"systems": {}, "commands": {}}
    environment = titan_environment(work_dir)
    with Services() as services:
        windows = (("titan", [], {}),
                   ("titan-2048", ["--max-model-len", str(settings.small_window)], {}),
                   (FULL_CONVERSATION, [], FULL_CONVERSATION_ENV))  # fmt: skip
        # each server's own slice of the workloads: llama-server's is 2
        for index, (name, extra, env) in zip((0, 1, 3), windows, strict=True):
            titan = start_titan(services, name, extra, {**environment, **env}, work_dir)
            results["commands"][name] = titan.command
            server = Server(name, titan.base_url, "SmolLM2-135M-Instruct", titan.pid)
            own = work.for_server(index, settings)
            if name == "titan":
                results["systems"][name] = measure(server, own, settings, say)
            say(
                f"{name}: {len(own.turns)} conversations of {settings.num_turns} turns through "
                "/v1/responses"
            )
            summaries = [
                conversation_summary(titan_conversation(server, turns, settings.turn_output_tokens))
                for turns in own.turns
            ]
            results["systems"].setdefault(name, {})["conversation"] = with_runs(summaries)
            stop(titan)
        llama = start_llama_server(
            services, binary, gguf, work_dir, num_slots=settings.num_at_once,
            context=settings.llama_context, threads=threads,
        )  # fmt: skip
        results["commands"]["llama-server"] = llama.command
        server = Server("llama-server", llama.base_url, "smollm2", llama.pid)
        own = work.for_server(2, settings)
        results["systems"]["llama-server"] = measure(server, own, settings, say)
        say(f"llama-server: a {settings.num_turns}-turn conversation through /v1/chat/completions")
        turns = chat_conversation(server, own.turns[0], settings.turn_output_tokens)
        summary = with_runs([conversation_summary(turns)])  # one: its ratio is no target
        results["systems"]["llama-server"]["conversation"] = summary
    versions = {
        "llama-server": llama_server_version(binary),
        "llama-cpp-python sdist": LLAMA_CPP_PYTHON,
    }
    say("context shift: trimmed turns answered shifted, exact and untrimmed")
    sizes = {"num_cases": 2, "turns_per_case": 3, "tokens_per_turn": 100, "answer_tokens": 8}
    results["context_shift_quality"] = context_shift_quality.measure(
        **(sizes if settings.is_quick else {})
    )
    results["meta"] = {"machine": {"cpu_flags": cpu_flags()}, "versions": versions}
    results["kernel"] = _titan_kernel_line(work_dir)
    return results


def cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((row for row in text.splitlines() if row.startswith(("flags", "Features"))), "")
    present = set(line.split(":", 1)[-1].split())
    return [flag for flag in CPU_FLAGS if flag in present]


def _default_gguf() -> Path:
    from titan.engine.model.loader import default_gguf_path

    return default_gguf_path()


def _titan_kernel_line(work_dir: Path) -> str:
    """What the engine logged it runs (weights, kernels, threads), from the first server's log."""
    log = work_dir / "titan.log"
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if "engine ready" in line:
            start = line.find("running ")
            return line[start + len("running ") : line.find(";", start)] if start >= 0 else line
    return "unknown"
