"""The routing benchmark (issue 24): its workloads share prefixes as they claim, its targets
judge the right ratios, and a quick run goes end to end through a real fleet."""

from __future__ import annotations

import itertools
from pathlib import Path

import orjson
import pytest

from benchmarks.base import measure
from benchmarks.routing_bench import RoutingSettings, _replica_config, _titan_config
from benchmarks.routing_report import BENCHMARK, reported, targets
from benchmarks.routing_workloads import WorkloadShape, build

SHAPE = WorkloadShape(num_tenants=3, system_tokens=200, num_conversations=4, turns=3,
                      unique_tokens=50)  # fmt: skip


def _text(body: dict) -> str:
    return "\n".join(message["content"] for message in body["messages"])


def test_tenants_repeat_their_long_system_prompts():
    bodies = build("tenants", SHAPE, seed=0, num_requests=30).bodies
    systems = {body["messages"][0]["content"] for body in bodies}
    assert len(systems) == SHAPE.num_tenants
    assert all(len(system) >= 4 * SHAPE.system_tokens for system in systems)
    assert len({body["messages"][1]["content"] for body in bodies}) == len(bodies)


def test_each_conversation_turn_extends_the_previous_one():
    """num_conversations live at a time, each ending after ``turns`` turns and replaced; the
    first live ones met mid-way, so the stream mixes all turns from its start."""
    num_requests = 5 * SHAPE.num_conversations * SHAPE.turns
    bodies = build("conversations", SHAPE, seed=0, num_requests=num_requests).bodies
    assert len(bodies) == num_requests
    by_conversation: dict[str, list[dict]] = {}
    for body in bodies:
        by_conversation.setdefault(body["messages"][0]["content"], []).append(body)
    for turns in by_conversation.values():
        assert len(turns) <= SHAPE.turns
        for earlier, later in itertools.pairwise(turns):
            assert later["messages"][: len(earlier["messages"])] == earlier["messages"]
            assert len(later["messages"]) == len(earlier["messages"]) + 2  # an answer, a question
        assert len(turns[-1]["messages"]) <= 2 * SHAPE.turns  # a system prompt, then turns
    # The first round already holds every turn number: turn k's prompt has 2k messages.
    first_round = bodies[: SHAPE.num_conversations]
    assert {len(b["messages"]) // 2 for b in first_round} == set(range(1, SHAPE.turns + 1))
    finished = [t for t in by_conversation.values() if len(t[-1]["messages"]) == 2 * SHAPE.turns]
    assert len(finished) >= 4 * SHAPE.num_conversations  # and new ones started in their place
    # Rounds are shuffled: the live slots' order differs from one round to the next.
    first = [b["messages"][0]["content"] for b in first_round]
    second = [b["messages"][0]["content"] for b in bodies[SHAPE.num_conversations :][: len(first)]]
    assert first != second and set(first) & set(second)


def test_unique_prompts_share_no_prefix_and_the_seed_decides():
    bodies = build("unique", SHAPE, seed=0, num_requests=50).bodies
    assert len(bodies) == 50 and len({_text(body)[:20] for body in bodies}) == len(bodies)
    assert build("unique", SHAPE, seed=0, num_requests=9) == build("unique", SHAPE, 0, 9)
    assert build("unique", SHAPE, seed=1, num_requests=9) != build("unique", SHAPE, 0, 9)
    with pytest.raises(ValueError, match="no workload 'typo'"):
        build("typo", SHAPE, 0, 0)


def test_real_replicas_are_titan_configs_scraped_by_titan_names():
    """--servers titan: each replica a valid config (one embedded deployment, small KV cache,
    no exact cache), the gateway reading Titan's metric names, its prefix index sized from the
    replica's KV cache."""
    from titan.config.loading import config_from_mapping

    replica = config_from_mapping(_replica_config(), "replica")
    (deployment,) = replica.models[0].deployments
    assert deployment.backend == "embedded" and deployment.engine.num_kv_blocks == 64
    assert replica.cache.exact is False
    settings = RoutingSettings.titan_fleet()
    gateway = _titan_config(["http://a", "http://b"], settings.replicas, "scored")
    config_from_mapping(gateway, "gateway")
    servers = {d["metrics"]["server"] for d in gateway["models"][0]["deployments"]}
    assert servers == {"titan"}
    assert gateway["models"][0]["deployments"][0]["prefix_cache_blocks"] == 64 * 16 * 2 // 256
    simulated = _titan_config(["http://a"], ("full",), "scored")["models"][0]["deployments"][0]
    assert simulated["metrics"]["server"] == "vllm"


def _case(p99: float, knee: float) -> dict:
    point = {"rate": 10.0, "ttft_s": {"p50": p99 / 2, "p99": p99}, "attainment": 1.0}
    return {"points": [point], "knee_rate": knee, "knee_throughput": knee, "replicas": []}


def test_targets_compare_scored_with_p2c_ewma():
    results = {"cases": {
        "tenants": {"p2c_ewma": _case(2.0, 10.0), "scored": _case(0.9, 16.0)},
        "unique": {"p2c_ewma": _case(1.0, 10.0), "scored": _case(1.1, 9.0)},
    }}  # fmt: skip
    verdicts = {check["name"].split(",")[0]: check for check in targets(results)}
    assert verdicts["tenants: TTFT p99 at 10/s"]["passed"] is True  # 0.45x
    assert verdicts["tenants: throughput at the knee"]["value"] == pytest.approx(1.6)
    assert verdicts["unique: TTFT p99 at 10/s"]["passed"] is False  # 1.10x > 1.05x
    assert verdicts["unique: throughput at the knee"]["passed"] is False  # 0.90x
    assert targets({"cases": {"tenants": {"p2c_ewma": _case(1.0, 1.0)}}}) == []
    # The real replicas' run shows the same ratios, judged by none of the simulated targets.
    shown = reported(results)
    assert [c["value"] for c in shown] == [c["value"] for c in targets(results)]
    assert {c["passed"] for c in shown} == {None}
    assert shown[0]["target"] == "(simulated fleet: ≤ 0.5×)"


@pytest.mark.bench_smoke
def test_quick_run_sweeps_each_policy_on_a_fresh_fleet(tmp_path: Path):
    output = tmp_path / "RESULTS.md"
    settings = RoutingSettings.quick(policies=("round_robin", "prefix_affinity"))
    outcome = measure(BENCHMARK, settings, output)
    cases = outcome.results["cases"]
    assert set(cases) == {"tenants", "conversations", "unique"}
    for workload in cases.values():
        for case in workload.values():
            assert [point["rate"] for point in case["points"]] == list(settings.rates)
            assert all(point["failed"] == 0 for point in case["points"])
            assert sum(replica["requests"] for replica in case["replicas"]) > 0
    # Tenants repeat their system prompts: some replica's cache served some of them.
    assert any(r["hits"] > 0 for r in cases["tenants"]["prefix_affinity"]["replicas"])
    assert "<!-- routing-bench:start -->" in output.read_text()
    assert orjson.loads(outcome.json_path.read_bytes())["cases"] == cases


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [("--workloads", "typo", "--workloads: unknown ['typo']"),
     ("--policies", "scored,nope", "--policies: unknown ['nope']"),
     ("--servers", "bogus", "--servers must be simulated or titan")],
)  # fmt: skip
def test_a_misspelt_option_is_refused_before_any_server_starts(option, value, message):
    from typer.testing import CliRunner

    from benchmarks.cli import build_app

    result = CliRunner().invoke(build_app(), ["routing", option, value])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split()).replace("│", "").replace("  ", " ")
