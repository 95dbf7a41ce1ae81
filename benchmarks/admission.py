"""``python -m benchmarks admission``: what admission control buys under overload, and how exactly
two replicas share one limit through Redis.

Phases: (1) goodput: an upstream of known capacity (``slots`` requests at once, ``latency_s``
each, an unbounded FIFO beyond: see admission_load) behind ``titan serve``; Poisson arrivals at
multiples of the capacity, each request with ``x-titan-deadline`` and a client timeout of the
same length; once with admission (the model's max_concurrency = the slots, a bounded queue) and
once without (no cap: everything goes to the upstream's queue). (2) replicas: two ``titan serve``
with one Redis, a model limit in requests/min, a closed-loop client alternating between them as
fast as it can; the admitted count against the token bucket's arithmetic.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks import admission_load as load
from benchmarks import gateway_load
from benchmarks.base import Benchmark
from benchmarks.gateway_systems import Workspace
from benchmarks.results_file import markdown_table, quick_note, record_lines
from titan.chaos import processes
from titan.chaos.processes import Services, free_port, get_json

MODEL = "sim"
Progress = Callable[[str], None]


@dataclass(frozen=True)
class AdmissionSettings:
    latency_s: float = 0.2  # the upstream's time per request
    slots: int = 8  # requests it runs at once: capacity = slots / latency_s
    multipliers: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0)  # offered load / capacity
    duration_s: float = 15.0  # of arrivals, per point
    deadline_s: float = 2.0  # x-titan-deadline, and the client's timeout
    max_queue: int | None = None  # None: what the deadline allows with room to spare
    warmup_s: float = 2.0  # at half the capacity, before each system's points
    seed: int = 0
    redis_url: str | None = "redis://127.0.0.1:6379"  # None: no replicas phase
    rpm: int = 600  # the shared model limit
    window_s: float = 10.0  # of the replicas' load
    concurrency: int = 128  # the replicas' client connections
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> AdmissionSettings:
        """Seconds per phase: a smoke run of everything (the test's)."""
        settings = cls(
            multipliers=(1.0, 3.0), duration_s=1.5, warmup_s=0.5, rpm=120, window_s=2.0,
            concurrency=16, is_quick=True,
        )  # fmt: skip
        return replace(settings, **overrides)

    @property
    def capacity_rps(self) -> float:
        return self.slots / self.latency_s

    @property
    def queue_size(self) -> int:
        """Half the deadline's worth of waiting: a full queue still answers in time."""
        if self.max_queue is not None:
            return self.max_queue
        return max(1, round(self.slots * (self.deadline_s / 2) / self.latency_s))


def titan_config(settings: AdmissionSettings, port: int, upstream_url: str, *, admission: bool):
    model: dict[str, Any] = {
        "name": MODEL,
        "deployments": [
            {"backend": "openai", "name": "upstream", "base_url": f"{upstream_url}/v1",
             "upstream_model": MODEL}
        ],
    }  # fmt: skip
    if admission:
        model["max_concurrency"] = settings.slots
    return {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning"},
        "models": [model],
        "admission": {"max_queue": settings.queue_size},
        # One deployment: a hedge would only add work to the same overloaded upstream.
        "hedge": {"enabled": False},
        "probes": {"enabled": False},
        "storage": "memory://",
    }


def _wait_idle(upstream_url: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        counts: Any = get_json(f"{upstream_url}/fifo")
        if counts["running"] == 0 and counts["waiting"] == 0:
            return
        time.sleep(0.1)


def run_goodput(settings: AdmissionSettings, workspace: Workspace, progress: Progress):
    capacity = settings.capacity_rps
    body = gateway_load.chat_body(MODEL, is_stream=False)
    headers = {"x-titan-deadline": f"{settings.deadline_s:g}"}
    points, commands, configs = [], {}, {}
    with Services() as services:
        port = free_port()
        argv = [
            sys.executable, "-m", "benchmarks.admission_load", "--port", str(port),
            "--latency-s", f"{settings.latency_s:g}", "--slots", str(settings.slots),
            "--model", MODEL,
        ]  # fmt: skip
        upstream = services.start(
            "upstream", argv, f"http://127.0.0.1:{port}", workspace.log_dir,
            ready_path="/health", timeout_s=30.0,
        )  # fmt: skip
        commands["upstream"] = upstream.command
        for system in ("on", "off"):
            config = titan_config(
                settings, free_port(), upstream.base_url, admission=system == "on"
            )
            env = {"TITAN_STORAGE": "memory://"}
            titan = load.start_titan(services, workspace, f"titan-{system}", config, env)
            commands[f"titan_{system}"], configs[system] = titan.command, config
            warmup = load.poisson_arrivals(capacity / 2, settings.warmup_s, settings.seed + 99)
            load.run_open_loop(titan.base_url, body, headers, warmup, settings.deadline_s)
            for index, multiplier in enumerate(settings.multipliers):
                progress(f"goodput: admission {system}, {multiplier:g}× capacity")
                _wait_idle(upstream.base_url)
                arrivals = load.poisson_arrivals(
                    capacity * multiplier, settings.duration_s, settings.seed + index
                )
                before: Any = get_json(f"{upstream.base_url}/fifo")  # restarts its peak
                records = load.run_open_loop(
                    titan.base_url, body, headers, arrivals, settings.deadline_s
                )
                after: Any = get_json(f"{upstream.base_url}/fifo")
                point = load.summarize_point(records, settings.duration_s)
                point.update(
                    admission=system, multiplier=multiplier, nominal_rps=capacity * multiplier,
                    upstream_served=after["served"] - before["served"],
                    upstream_left_queue=after["left"] - before["left"],
                    upstream_peak_queue=after["peak_waiting"],
                )  # fmt: skip
                points.append(point)
            _wait_idle(upstream.base_url)
            processes.stop(titan)
    return {"points": points, "commands": commands, "configs": configs}


def _target(name: str, value: float | None, comparison: str, target: float, unit: str):
    passed = value is not None and (value >= target if comparison == ">=" else value <= target)
    return {"name": name, "value": value, "comparison": comparison, "target": target,
            "unit": unit, "passed": passed}  # fmt: skip


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    checks = []
    points = results["goodput"]["points"] if results.get("goodput") else []
    goodput = {(p["admission"], p["multiplier"]): p["goodput_rps"] for p in points}
    for system, comparison, bound in (("on", ">=", 0.9), ("off", "<=", 0.5)):
        at_1, at_3 = goodput.get((system, 1.0)), goodput.get((system, 3.0))
        ratio = at_3 / at_1 if at_1 and at_3 is not None else None
        what = "with admission" if system == "on" else "without admission (collapse shown)"
        checks.append(_target(f"goodput at 3× / at 1×, {what}", ratio, comparison, bound, "×"))
    refusals = sorted(ms for p in points if p["admission"] == "on"
                      for ms in p["refusal_latencies_ms"])  # fmt: skip
    p99 = load.percentile(refusals, 99) if refusals else None
    checks.append(_target("refusal latency p99, with admission (all points)", p99, "<=", 20, " ms"))
    replicas = results.get("replicas")
    if replicas is not None:
        error = abs(replicas["error_pct"])
        checks.append(_target("2 replicas: |admitted − expected| / expected", error, "<=", 2, "%"))
    return checks


def _redis_server(redis_url: str | None) -> str | None:
    server = None
    if redis_url:
        import redis

        client = redis.Redis.from_url(redis_url, socket_connect_timeout=5)
        try:  # before the goodput phase: a missing Redis fails the run at once
            with contextlib.closing(client):
                server = str(client.info("server").get("redis_version"))
        except redis.RedisError as exc:
            raise RuntimeError(f"{redis_url}: {exc} (--skip-replicas runs without)") from None
    return server


def run(settings: AdmissionSettings, progress: Progress) -> dict[str, Any]:
    """Both phases (replicas only with a Redis); Redis's versions and the derived capacity and
    queue size join the record."""
    server = _redis_server(settings.redis_url)  # first: a missing Redis fails the run at once
    with tempfile.TemporaryDirectory(prefix="titan-admission-bench-") as root:
        workspace = Workspace(Path(root))
        goodput = run_goodput(settings, workspace, progress)
        replicas = load.run_replicas(settings, workspace, progress) if settings.redis_url else None
    derived = {"capacity_rps": settings.capacity_rps, "queue_size": settings.queue_size}
    meta = {"settings": derived, "versions": {"redis_server": server}}
    return {"meta": meta, "goodput": goodput, "replicas": replicas}


# ---- the report --------------------------------------------------------------------------

SECTION_START, SECTION_END = ("<!-- admission-bench:start -->", "<!-- admission-bench:end -->")
_GOODPUT_HEADER = [
    "admission", "load", "offered RPS", "goodput (RPS)", "p50 (ms)", "p99 (ms)", "refused",
    "refusal p99 (ms)", "dropped", "late", "errors", "upstream peak queue",
]  # fmt: skip
_REPLICAS_HEADER = ["replicas", "limit", "elapsed (s)", "requests", "admitted (per replica)",
                    "expected", "error"]  # fmt: skip


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def report_tables(results: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Title → (header, rows): the same tables on the console and in the Markdown."""
    tables = {"Targets": (["check", "measured", "target", "result"], [])}
    for t in results["targets"]:
        sign = "≥" if t["comparison"] == ">=" else "≤"
        measured = _num(t["value"], 2) + (t["unit"] if t["value"] is not None else "")
        verdict = "PASS" if t["passed"] else "FAIL"
        tables["Targets"][1].append([t["name"], measured, f"{sign} {t['target']:g}{t['unit']}",
                                     verdict])  # fmt: skip
    rows = [
        [p["admission"], f"{p['multiplier']:g}×",
         f"{p['offered_rps']:.1f}", f"**{p['goodput_rps']:.1f}**", _num(p["p50_ms"]),
         _num(p["p99_ms"]), str(p["num_refused"]), _num(p["refusal_p99_ms"]),
         str(p["num_dropped"]), str(p["num_late"]), str(p["num_errors"]),
         str(p["upstream_peak_queue"])]
        for p in results["goodput"]["points"]
    ]  # fmt: skip
    tables["Goodput under overload"] = (_GOODPUT_HEADER, rows)
    r = results["replicas"]
    if r is not None:
        per = " + ".join(str(n) for n in r["admitted_by_replica"])
        tables["Two replicas, one limit"] = (_REPLICAS_HEADER, [[
            "2", f"{r['rpm']} rpm", f"{r['elapsed_s']:.2f}", str(r["num_requests"]),
            f"{r['num_admitted']} ({per})", f"{r['expected']:.1f}", f"{r['error_pct']:+.2f}%",
        ]])  # fmt: skip
    return tables


def _yaml(data: Any) -> list[str]:
    import yaml

    return ["```yaml", yaml.safe_dump(data, sort_keys=False).rstrip("\n"), "```"]


def render_markdown(results: dict[str, Any], json_name: str = "") -> str:
    meta, goodput, replicas = results["meta"], results["goodput"], results["replicas"]
    s = meta["settings"]
    tables = report_tables(results)
    lines = [SECTION_START, "## Admission benchmark (`python -m benchmarks admission`)", ""]
    lines += [
        *quick_note(meta),
        *record_lines(meta, "The load generator, Titan, the upstream and Redis share these cores."),
        "",
        "### Targets",
        "",
        *markdown_table(*tables["Targets"]),
        "",
        "### Goodput under overload",
        "",
        f"One upstream of known capacity (`python -m benchmarks.admission_load`) answering in "
        f"{s['latency_s'] * 1000:g} ms, at most {s['slots']} requests at once and an unbounded "
        f"FIFO queue beyond (capacity **{s['capacity_rps']:g} requests/s**); a request whose "
        "client leaves while it waits leaves the queue. Titan (`titan serve`, one process, "
        "hedging and probes off) in front of it: *on*: the model's `max_concurrency: "
        f"{s['slots']}`, `admission.max_queue: {s['queue_size']}` (half the deadline's worth of "
        "waiting); *off*: no concurrency cap, so Titan forwards everything at once. Open-loop "
        f"Poisson arrivals for {s['duration_s']:g} s per point (the same seeded arrivals for on "
        f"and off), non-streaming chat, each with `x-titan-deadline: {s['deadline_s']:g}` and a "
        f"client timeout of {s['deadline_s']:g} s; {s['warmup_s']:g} s at half the capacity "
        "first, and each point starts with the upstream idle. Goodput: successful answers "
        "within the deadline that completed within the arrivals' window, per second (a queue's "
        "backlog served after it does not count). Refused: answered at once (503 "
        "`queue_full` / `deadline_unreachable`); dropped: 503 `queue_timeout` after a wait; "
        "late: no answer by the deadline (the client leaves, Titan cancels the upstream call). "
        "Latency percentiles are over successes; upstream peak queue: its FIFO's longest.",
        "",
        *markdown_table(*tables["Goodput under overload"]),
        "",
    ]
    if replicas is not None:
        lines += [
            "### Two replicas, one limit",
            "",
            f"Two `titan serve` sharing Redis (`{replicas['storage']}`, a database of the run's "
            f"own, its {replicas['num_keys_deleted']} keys deleted afterwards), model limit "
            f"`rpm: {replicas['rpm']}`, a simulated deployment answering in 1 ms. A closed-loop "
            f"client with {s['concurrency']} connections alternates between the replicas "
            f"request by request for {s['window_s']:g} s ({replicas['rps']:.0f} requests/s, "
            f"{replicas['num_refused']} answered 429, {replicas['num_errors']} errors). "
            "Expected: the token bucket's arithmetic, capacity + refill × elapsed = "
            f"{replicas['rpm']} + {replicas['rpm'] / 60:g}/s × the time from the first request "
            "to the last; admitted per replica from each one's `/metrics`.",
            "",
            *markdown_table(*tables["Two replicas, one limit"]),
            "",
        ]
    lines += ["### Commands and configs", ""]
    lines += [f"- {name}: `{command}`" for name, command in goodput["commands"].items()]
    if replicas is not None:
        lines += [f"- replica {i + 1}: `{c}`" for i, c in enumerate(replicas["commands"])]
    lines += ["", "<details><summary>Configs</summary>", ""]
    for name, config in goodput["configs"].items():
        lines += [f"Titan, admission {name} (ports vary per run):", "", *_yaml(config), ""]
    if replicas is not None:
        lines += ["Each replica:", "", *_yaml(replicas["config"]), ""]
    lines += ["</details>", ""]
    if json_name:
        lines += [f"Raw numbers: `{json_name}`.", ""]
    return "\n".join([*lines, SECTION_END]) + "\n"


BENCHMARK = Benchmark(
    "admission",
    run,
    render_markdown,
    report_tables,
    targets,
    packages=("titan", "aiohttp", "uvicorn", "redis"),
)
