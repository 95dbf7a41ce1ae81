"""`python -m benchmarks structured`'s report: console tables and its bench/RESULTS.md section."""

from __future__ import annotations

from typing import Any

from benchmarks import results_file, structured_bench
from benchmarks.base import Benchmark
from benchmarks.results_file import markdown_table

NAME = "structured"

# The target: half the batch constrained costs at most this much throughput.
TARGET_SLOWDOWN = 0.15

LIBRARY_CHOICE = """\
Library choice, measured on SmolLM2's tokenizer (49,152 tokens) with a nested JSON schema
(one run, same machine; per-token mask = median over the 43 tokens of a valid answer):

| library | tokenizer setup | compile, first | again | mask/token (median, max) | extra deps |
| --- | --- | --- | --- | --- | --- |
| **llguidance 1.9.1** (chosen) | 0.21 s | 1.1 ms | 0.04 ms | 11 µs, 1.3 ms | none |
| xgrammar 0.2.9 | 0.21 s | 5.2 ms | 0.06 ms | 1.1 µs, 98 µs | transformers, triton, tvm-ffi |
| outlines-core 0.2.14 | 0.08 s | 72 ms | 72 ms | 0.4 µs, 133 µs | none; regex only |

All three accepted the valid answer and rejected an invalid one. llguidance: JSON Schema, regex
and Lark/GBNF grammars from one small wheel without Python dependencies, fast compiles (a new
schema per request costs ~1 ms), masks computed in Rust without the GIL; its per-token mask is
slower than xgrammar's but ~1 % of a decode step here. xgrammar's wheel declares triton and
transformers (a CUDA stack on a CPU box); outlines-core compiles a schema in 70 ms and has no
context-free grammars.
"""


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def report_tables(results: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    summary, slowdown = results["summary"], results["slowdown"]
    throughput = (
        ["batch", "decode tokens/s (full batch)", "end-to-end tokens/s"],
        [
            ["none constrained", _num(summary["none"]["full_batch_tokens_per_s"]),
             _num(summary["none"]["tokens_per_s"])],
            ["half constrained (JSON schema)", _num(summary["half"]["full_batch_tokens_per_s"]),
             _num(summary["half"]["tokens_per_s"])],
            ["slowdown", _pct(slowdown["full_batch_tokens_per_s"]), _pct(slowdown["tokens_per_s"])],
        ],
    )  # fmt: skip
    compile_ = results["compile"]
    compiles = (
        ["what", "time"],
        [
            ["llguidance tokenizer (once per engine)", f"{results['tokenizer_setup_s']:.2f} s"],
            ["schema compile, first (median)", f"{compile_['first_ms']:.2f} ms"],
            ["schema compile, cached (median)", f"{compile_['cached_ms']:.3f} ms"],
        ],
    )  # fmt: skip
    return {"Throughput (medians over rounds)": throughput, "Schema compile": compiles}


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:+.1f} %"


def render_markdown(results: dict[str, Any], json_name: str = "") -> str:
    start, end = results_file.markers(NAME)
    meta = results["meta"]
    settings, machine = meta["settings"], meta["machine"]
    slowdown = results["slowdown"]["full_batch_tokens_per_s"]
    verdict = (
        "–" if slowdown is None
        else ("met" if slowdown <= TARGET_SLOWDOWN else "missed")
    )  # fmt: skip
    lines = [
        start,
        "## Structured output (constrained decoding)",
        "",
        f"Command: `{meta['command']}`. "
        f"{settings['num_requests']} chat requests, max_tokens {settings['max_tokens']}, "
        f"temperature 0.8 seeded, ignore_eos; {settings['num_rounds']} rounds, medians. "
        f"dtype {results['dtype']}, {results['threads']} torch thread(s), "
        f"{machine['num_cores']} CPUs; versions: "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
        + f". Load average before/after: {machine['load_average_before']:.2f} / "
        f"{machine['load_average_after']:.2f}.",
        "",
        f"Target: half the batch constrained at most {TARGET_SLOWDOWN:.0%} slower "
        f"(full-batch decode): **{verdict}**.",
        "",
    ]
    for title, (header, rows) in report_tables(results).items():
        lines += [f"**{title}**", "", *markdown_table(header, rows), ""]
    if json_name:
        lines += [f"Raw numbers: `{json_name}`.", ""]
    lines += [LIBRARY_CHOICE, end]
    return "\n".join(lines)


BENCHMARK = Benchmark(
    NAME,
    structured_bench.run,
    render_markdown,
    report_tables,
    packages=("titan", "torch", "llguidance"),
)
