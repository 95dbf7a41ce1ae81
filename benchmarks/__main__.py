"""``python -m benchmarks NAME [--quick] [--output bench/RESULTS.md]``."""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import orjson

from titan.bench.results_file import json_path_for, write_section

BENCHMARKS = ("llamacpp", "quality", "cuda", "constrained")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("name", choices=BENCHMARKS)
    parser.add_argument("--quick", action="store_true", help="a small, fast smoke run")
    parser.add_argument("--output", type=Path, default=Path("bench/RESULTS.md"))
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "benchmarks", *(argv or sys.argv[1:])])
    if args.name in ("quality", "cuda"):
        from benchmarks import cuda, quality

        module = quality if args.name == "quality" else cuda
        results = quality.run_all() if args.name == "quality" else cuda.run()
        section = module.render_markdown(results, command)
        print(section)
        write_section(args.output, section, module.BENCHMARK)
        return 0
    if args.name == "constrained":
        from benchmarks import constrained

        settings = constrained.Settings.quick() if args.quick else constrained.Settings()
        results = _served(constrained.run, settings)
        json_path = _save_json(args.output, constrained.BENCHMARK, results)
        section = constrained.render_markdown(results, command)
        name = constrained.BENCHMARK
    else:
        from benchmarks import llamacpp, llamacpp_report

        settings = llamacpp.Settings.quick() if args.quick else llamacpp.Settings()
        results = _served(llamacpp.run, settings)
        json_path = _save_json(args.output, llamacpp_report.BENCHMARK, results)
        section = llamacpp_report.render_markdown(results, command, json_path.name)
        name = llamacpp_report.BENCHMARK
    print(section)
    if not args.quick:
        write_section(args.output, section, name)
    return 0


def _served(run: Callable[..., dict], settings: object) -> dict:
    """A benchmark that starts servers, run in a work folder of its own."""
    with tempfile.TemporaryDirectory(prefix="titan-bench-") as work:
        return run(settings, Path(work), say=lambda text: print(text, flush=True))


def _save_json(output: Path, benchmark: str, results: dict) -> Path:
    out_dir = output.parent / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = json_path_for(out_dir, benchmark)
    json_path.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return json_path


if __name__ == "__main__":
    sys.exit(main())
