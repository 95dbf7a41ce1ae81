"""The deploy assets against what Titan exports: every metric (and label) that the Grafana
dashboard and the Prometheus alert rules use exists on ``/metrics``, and every alert has a
runbook section in docs/runbook.md. Renaming a metric or a label without updating
``deploy/`` fails here."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from titan.observability.collectors import (
    BREAKER_STATES,
    ENGINE_COUNTERS,
    ENGINE_GAUGES,
    LiveState,
)
from titan.observability.metrics import MULTIPROC_ENV, TitanMetrics
from titan.observability.records import RequestRecord
from titan.storage.base import JOB_STATES

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "titan-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "titan-alerts.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"

# Labels Prometheus adds when it scrapes (and prometheus-client's multi-process mode adds).
TARGET_LABELS = frozenset({"instance", "job", "pid"})
SEVERITIES = frozenset({"critical", "warning", "info"})
RUNBOOK_PARTS = ("**What it means.**", "**How to confirm.**", "**What to do.**")
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_METRIC = re.compile(r"(?<![A-Za-z0-9_:])titan_[A-Za-z0-9_:]*")
_SELECTOR = re.compile(r"(?<![A-Za-z0-9_:])(titan_[A-Za-z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_FENCED = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.MULTILINE | re.DOTALL)
_ITALIC = re.compile(r"(?<![*\w])\*([^*\s][^*]*?)\*(?![*\w])")


# ---- what Titan exports ----------------------------------------------------------------------


@dataclass(frozen=True)
class Exported:
    families: dict[str, str]  # family name -> type (counter, gauge, histogram)
    samples: dict[str, frozenset[str]]  # sample name -> its label names

    def family(self, name: str) -> str | None:
        """The family a name in a query reads: ``_bucket``, ``_sum`` and ``_count`` of a
        histogram, ``_total`` of a counter, or a gauge itself."""
        for suffix, kinds in (
            ("_bucket", {"histogram"}),
            ("_sum", {"histogram"}),
            ("_count", {"histogram"}),
            ("_total", {"counter"}),
        ):
            base = name.removesuffix(suffix)
            if base != name and self.families.get(base) in kinds:
                return base
        return name if self.families.get(name) == "gauge" else None


def fake_stats() -> dict[str, Any]:
    """``Pipeline.stats()`` of one model with one embedded deployment."""
    backend: dict[str, float] = {key: 3 for key in ENGINE_COUNTERS}
    backend.update({key: 0.5 for key in ENGINE_GAUGES})
    return {
        "m": {
            "requests": 2,
            "served_as_fallback": 1,
            "hedges": 1,
            "admission": {},
            "deployments": {
                "d": {
                    "deployment": "d",
                    "state": "open",
                    "outstanding": 1,
                    "attempts": 3,
                    "successes": 2,
                    "failures": 1,
                    "backend": backend,
                }
            },
        }
    }


def titan_metrics() -> TitanMetrics:
    metrics = TitanMetrics(known_tenants=frozenset({"acme"}))
    metrics.watch(LiveState(fake_stats))
    answered = RequestRecord(
        "req-1", "/v1/chat/completions", is_stream=True, tenant="acme", model="m",
        deployment="d", priority="interactive", num_attempts=2, cache="miss", queue_s=0.01,
        ttft_s=0.2, total_s=1.0, inter_token_s=[0.02, 0.03],
    )  # fmt: skip
    metrics.observe(answered, None)
    failed = RequestRecord("req-2", "/v1/chat/completions", tenant="acme", model="m")
    failed.failed(503, "queue_full")
    metrics.observe(failed, None)
    for state in JOB_STATES:
        metrics.jobs.labels(state).set(1)
    # Every other labelled metric gets a child, so that its family renders with its labels.
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            names = metric._labelnames
            if names:
                metric.labels(*(["x"] * len(names)))
    return metrics


@pytest.fixture(scope="module")
def exported() -> Exported:
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(MULTIPROC_ENV, raising=False)
        text = titan_metrics().render().decode()
    families: dict[str, str] = {}
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        families[family.name] = family.type
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return Exported(families, {name: frozenset(labels) for name, labels in samples.items()})


# ---- the assets ------------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside (collapsed) rows included."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels") or [])


def dashboard_exprs() -> list[tuple[str, str]]:
    exprs = []
    for panel in all_panels(dashboard()["panels"]):
        for target in panel.get("targets") or []:
            exprs.append((f"panel {panel['title']!r}", target["expr"]))
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            query = query["query"] if isinstance(query, dict) else query
            exprs.append((f"variable {variable['name']!r}", query))
    return exprs


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def alert_exprs() -> list[tuple[str, str]]:
    return [(f"alert {rule['alert']}", rule["expr"]) for rule in alert_rules()]


def all_exprs() -> list[tuple[str, str]]:
    return dashboard_exprs() + alert_exprs()


def without_strings(expr: str) -> str:
    return _STRING.sub('""', expr)


def metric_names(expr: str) -> set[str]:
    return set(_METRIC.findall(without_strings(expr)))


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def runbook_sections() -> dict[str, str]:
    """Anchor -> the text under that heading (to the next heading of any level), code blocks
    left out (a ``# comment`` in one is no heading)."""
    text = _FENCED.sub("", RUNBOOK.read_text())
    matches = list(_HEADING.finditer(text))
    sections = {}
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following is not None else len(text)
        sections[anchor(match.group(1))] = text[match.end() : end]
    return sections


# ---- the checks ------------------------------------------------------------------------------


def test_every_family_renders(exported: Exported) -> None:
    """The fixture is complete: the families of the live state and the engines are there."""
    names = {name for name, _ in ENGINE_COUNTERS.values()}
    names |= {name for name, _ in ENGINE_GAUGES.values()}
    names |= {"titan_hedges", "titan_fallbacks", "titan_attempts", "titan_circuit_state"}
    names |= {"titan_deployment_outstanding", "titan_jobs", "titan_goodput_requests"}
    assert names <= set(exported.families)


def test_dashboard_is_importable_json() -> None:
    board = dashboard()
    assert board["schemaVersion"] >= 36
    assert board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    model = variables["model"]["query"]
    model = model["query"] if isinstance(model, dict) else model
    assert model == "label_values(titan_requests_total, model)"
    panels = list(all_panels(board["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            assert target["expr"].strip(), panel["title"]


def test_alert_rules_are_well_formed() -> None:
    document = yaml.safe_load(ALERTS.read_text())
    assert set(document) == {"groups"}
    group_names = [group["name"] for group in document["groups"]]
    assert len(group_names) == len(set(group_names))
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), "alert names must be unique"
    required = {
        "TitanHighTTFTP99", "TitanHighErrorRate", "TitanQueueBacklog", "TitanKVCacheNearlyFull",
        "TitanCircuitOpen", "TitanRefusalsSpike", "TitanGoodputLow", "TitanJobsDeadLetters",
    }  # fmt: skip
    assert required <= set(names)
    for rule in rules:
        name = rule["alert"]
        assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
        assert isinstance(rule["expr"], str) and rule["expr"].strip(), name
        assert DURATION.match(str(rule.get("for", "0s"))), name
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert annotations["summary"].strip() and annotations["description"].strip(), name
        assert annotations["runbook_url"].endswith(f"docs/runbook.md#{name.lower()}"), name


def test_queries_are_balanced() -> None:
    """A cheap syntax check (no promtool here): brackets pair up, and alert rules use no
    Grafana variables."""
    pairs = {")": "(", "]": "[", "}": "{"}
    for where, expr in all_exprs():
        stack: list[str] = []
        for char in without_strings(expr):
            if char in "([{":
                stack.append(char)
            elif char in pairs:
                assert stack and stack.pop() == pairs[char], f"{where}: unbalanced {expr!r}"
        assert not stack, f"{where}: unbalanced {expr!r}"
    for where, expr in alert_exprs():
        assert "$" not in without_strings(expr), f"{where} uses a Grafana variable"


def test_every_metric_used_is_exported(exported: Exported) -> None:
    unknown = []
    for where, expr in all_exprs():
        names = metric_names(expr)
        assert names, f"{where} reads no titan_ metric: {expr!r}"
        for name in sorted(names):
            if name not in exported.samples or exported.family(name) is None:
                unknown.append(f"{where}: {name}")
    assert not unknown, "metrics Titan does not export:\n" + "\n".join(unknown)


def test_every_label_used_is_exported(exported: Exported) -> None:
    """Label matchers name labels of their metric; by/on/without clauses name labels of the
    query's metrics (or those Prometheus adds)."""
    unknown = []
    for where, expr in all_exprs():
        used: set[str] = set(TARGET_LABELS)
        for name in metric_names(expr):
            used |= exported.samples.get(name, frozenset())
        for match in _SELECTOR.finditer(expr):
            name, matchers = match.groups()
            labels = exported.samples.get(name, frozenset()) | TARGET_LABELS
            for label, _, _ in _MATCHER.findall(matchers):
                if label not in labels:
                    unknown.append(f"{where}: {name}{{{label}}}")
        for _, labels_text in _GROUPING.findall(without_strings(expr)):
            for label in filter(None, (part.strip() for part in labels_text.split(","))):
                if label not in used:
                    unknown.append(f"{where}: label {label!r}")
        if expr.startswith("label_values("):
            name, label = (part.strip() for part in expr[len("label_values(") : -1].split(","))
            if label not in exported.samples.get(name, frozenset()):
                unknown.append(f"{where}: {name}{{{label}}}")
    assert not unknown, "labels Titan does not export:\n" + "\n".join(unknown)


def test_label_values_used_exist() -> None:
    """The job states and breaker states the rules compare with are Titan's."""
    for where, expr in all_exprs():
        for match in _SELECTOR.finditer(expr):
            name, matchers = match.groups()
            for label, op, value in _MATCHER.findall(matchers):
                if name == "titan_jobs" and label == "state" and op == "=":
                    assert value in JOB_STATES, f"{where}: no job state {value!r}"
    rules = {rule["alert"]: rule["expr"] for rule in alert_rules()}
    assert f"== {BREAKER_STATES['open']}" in rules["TitanCircuitOpen"]
    assert f"== {BREAKER_STATES['open']}" in rules["TitanAllCircuitsOpen"]


def test_every_alert_has_a_runbook_section() -> None:
    sections = runbook_sections()
    for rule in alert_rules():
        name = rule["alert"]
        target = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert target in sections, f"docs/runbook.md has no heading for #{target}"
        assert anchor(name) == target, name
        for part in RUNBOOK_PARTS:
            assert part in sections[target], f"the runbook's {name} section lacks {part}"


def test_runbook_names_dashboard_panels() -> None:
    """The charts the runbook names (in *italics*) are panels of the dashboard."""
    titles = {panel["title"] for panel in all_panels(dashboard()["panels"])}
    text = _FENCED.sub("", RUNBOOK.read_text())
    named = {" ".join(name.split()) for name in _ITALIC.findall(text)}
    assert named, "the runbook names no dashboard panel"
    assert not named - titles, f"not panels of the dashboard: {sorted(named - titles)}"


def test_runbook_links_resolve() -> None:
    """Links between runbook sections point at headings that exist."""
    text = RUNBOOK.read_text()
    sections = runbook_sections()
    for target in re.findall(r"\]\(#([^)]+)\)", text):
        assert target in sections, f"docs/runbook.md links to a missing #{target}"
    for target in re.findall(r"\]\((\.\./[^)#]+)\)", text):
        assert (RUNBOOK.parent / target).resolve().exists(), target
