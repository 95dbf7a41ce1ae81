"""The scenario format: what it accepts, the one-line messages for what it does not, the
shorthands, time scaling, and every shipped scenario."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.chaos.factories import scenario_data
from titan.chaos.scenario_files import (
    load_scenario,
    resolve,
    scenario_from_mapping,
    shipped_scenarios,
)
from titan.chaos.titan_config import check_titan_config, titan_config
from titan.errors import ConfigError

SEVEN = {
    "periodic-p99-spikes",
    "throughput-plateau",
    "intermittent-timeouts",
    "low-utilization-high-latency",
    "flapping-replica",
    "429-storm",
    "slow-stream",
}


def problem(**changes: object) -> str:
    with pytest.raises(ConfigError) as caught:
        scenario = scenario_from_mapping(scenario_data(**changes), "s.yaml")
        check_titan_config(scenario, "s.yaml", environ={})
    message = caught.value.message
    assert "\n" not in message and message.startswith("s.yaml: ")
    return message


def test_a_valid_scenario_and_its_shorthands():
    data = scenario_data(
        assertions=["p99_ttft_ms <= 500", {"breaker_opened": "b", "during": "slow"}]
    )
    scenario = scenario_from_mapping(data, "s.yaml")
    checks = [a.check for a in scenario.assertions]
    assert checks == ["p99_ttft_ms <= 500", "breaker_openings(b) >= 1"]
    assert scenario.assertions[1].during == "slow"
    assert scenario.faults[0].name == "slow" and scenario.replica_names() == ["titan-1"]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"nam": "x"}, "unknown key 'nam'"),
        ({"duration_s": 0}, "duration_s"),
        ({"backends": [{"name": "a"}]}, "exactly one of 'simulated' or 'url'"),
        ({"backends": [{"name": "a", "simulated": {"ttft": 1}}]}, "unknown key 'ttft'"),
        ({"load": {"model": "chat"}}, "needs a rate"),
        ({"load": {"model": "chat", "rate": 5, "concurency": 3}}, "unknown key 'concurency'"),
        ({"faults": [{"at_s": 1, "kind": "stall", "target": "b"}]}, "needs duration_s"),
        (
            {"faults": [{"at_s": 1, "kind": "stall", "target": "b", "duration_s": 1,
                         "multiplier": 2}]},
            "a stall fault takes no 'multiplier' (its parameters: stall_s, probability)",
        ),
        (
            {"faults": [{"at_s": 1, "kind": "error_burst", "target": "b", "duration_s": 1,
                         "status": 200}]},
            "status",
        ),
        ({"faults": [{"at_s": 1, "kind": "kill", "target": "zz"}]}, "unknown target 'zz'"),
        (
            {"faults": [{"at_s": 1, "kind": "stall", "target": "titan", "duration_s": 1}]},
            "Titan replicas take only kill",
        ),
        ({"faults": [{"at_s": 1, "kind": "kill_restart", "target": "b"}]}, "needs down_s"),
        (
            {"faults": [{"at_s": 1, "kind": "kill", "target": "titan-1"}],
             "load": {"model": "chat", "concurrency": 4}},
            "killing a Titan replica needs an open-loop load",
        ),
        ({"faults": [{"at_s": 11, "kind": "kill", "target": "b"}]}, "after the run ends"),
        ({"assertions": ["p99_tft_ms <= 5"]}, "did you mean 'p99_ttft_ms'?"),
        ({"assertions": ["p99_ttft_ms is small"]}, "METRIC[(ARG)] OP NUMBER"),
        ({"assertions": ["breaker_openings >= 1"]}, "needs an argument"),
        ({"assertions": [{"check": "error_rate == 0", "during": "nope"}]}, "no fault 'nope'"),
        (
            {"titan": {"config": {"models": [{"name": "chat",
                                              "deployments": [{"upstream": "c"}]}]}}},
            "upstream: no backend 'c' (backends: a, b)",
        ),
        (
            {"titan": {"config": {"models": [{"name": "chat", "deployments": [
                {"upstream": "a", "weigth": 2}]}]}}},
            "models[0].deployments[0].weigth: unknown key 'weigth'; did you mean 'weight'?",
        ),
        ({"titan": {"config": {}}}, "titan.config needs models"),
    ],
)  # fmt: skip
def test_problems_are_one_line_naming_the_key(changes, expected):
    assert expected in problem(**changes)


def test_a_real_backend_takes_no_runtime_fault_without_fault_control():
    backends = [{"name": "a", "simulated": {}}, {"name": "b", "url": "http://vllm:8000/v1"}]
    assert "real backend without fault_control" in problem(backends=backends)
    kill = [{"at_s": 1, "kind": "kill", "target": "b"}]
    assert "only processes the run started" in problem(backends=backends, faults=kill)
    backends[1]["fault_control"] = True
    scenario_from_mapping(scenario_data(backends=backends), "s.yaml")


def test_scaling_multiplies_the_timeline_only():
    data = scenario_data(
        faults=[{"id": "f", "at_s": 2, "kind": "kill_restart", "target": "b", "down_s": 1,
                 "every_s": 3, "times": 2}],
        assertions=[{"check": "error_rate == 0", "window": [1, 4]},
                    {"check": "error_rate == 0", "during": "f", "extend_s": 1}],
        load={"model": "chat", "warmup_s": 2, "timeout_s": 9,
              "stages": [{"duration_s": 4, "rate": 5}, {"duration_s": 6, "rate": 10}]},
    )  # fmt: skip
    scaled = scenario_from_mapping(data, "s.yaml").scaled(0.5)
    assert scaled.duration_s == 5
    fault = scaled.faults[0]
    assert (fault.at_s, fault.down_s, fault.every_s, fault.occurrences()) == (1, 0.5, 1.5, [1, 2.5])
    assert scaled.assertions[0].window == (0.5, 2) and scaled.assertions[1].extend_s == 0.5
    assert [stage.duration_s for stage in scaled.load.stages] == [2, 3]
    assert (scaled.load.warmup_s, scaled.load.timeout_s) == (2, 9)  # systems' times: unscaled
    assert scaled.report.window_s == 0.5 and scaled.report.sample_every_s == 0.25
    assert scaled.backends[0].simulated.ttft_s == 0.01


def test_stages_must_fill_the_run():
    stages = [{"duration_s": 4, "rate": 5}]
    assert "add up to duration_s" in problem(load={"model": "chat", "stages": stages})


def test_the_titan_config_points_deployments_at_the_backends():
    scenario = scenario_from_mapping(scenario_data(), "s.yaml")
    config = titan_config(scenario, {"a": "http://127.0.0.1:1/v1", "b": "http://127.0.0.1:2/v1"}, 7)
    assert config["server"] == {"host": "127.0.0.1", "port": 7, "log_level": "warning"}
    assert config["storage"] == "memory://"
    deployments = config["models"][0]["deployments"]
    assert deployments[1] == {"backend": "openai", "name": "b", "base_url": "http://127.0.0.1:2/v1"}


def test_every_shipped_scenario_loads():
    shipped = shipped_scenarios()
    assert set(shipped) == SEVEN
    for name, path in shipped.items():
        loaded = load_scenario(name)
        assert loaded.scenario.name == name and Path(loaded.source) == path
        assert loaded.scenario.assertions, name
        assert path.read_text().startswith(f"# {name}\n#\n# Symptom:"), name


def test_resolve_a_file_or_a_name(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("name: x\n")
    assert resolve(str(path)) == path
    assert resolve("429-storm") == shipped_scenarios()["429-storm"]
    with pytest.raises(ConfigError, match="no shipped scenario of that name"):
        resolve("nope")


def test_a_broken_yaml_file_says_where(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+:\d+: invalid YAML"):
        load_scenario(str(path))


def test_an_unknown_workload_is_refused_when_the_scenario_loads(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(
        yaml.safe_dump(scenario_data(load={"model": "chat", "rate": 1, "workload": "x"}))
    )
    with pytest.raises(ConfigError, match=r"load\.workload: unknown workload 'x'"):
        load_scenario(str(path))
