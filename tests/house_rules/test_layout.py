"""The layout rules of DESIGN.md section 5 (as amended in docs/ARCHITECTURE.md), the module size
limit and the exact public API."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "titan"
MAX_LINES = 400

# Modules anyone may import: the exception tree and the settings.
SHARED = {"titan.errors", "titan.config"}

# package -> the titan packages it may import (besides itself and SHARED)
ALLOWED = {
    # The native CPU kernels (C sources built at run time): the engine's quantized path and
    # attention, and the semantic cache's embedder.
    "titan.engine": {"titan.kernels"},
    "titan.kernels": set(),
    "titan.protocol": set(),
    "titan.observability": set(),
    "titan.router": set(),
    # The model-server mode's step cost is the planner's (pure).
    "titan.simulate": {"titan.protocol", "titan.planning"},
    "titan.api": {"titan.service", "titan.protocol", "titan.observability"},
    "titan.service": {
        "titan.backends",
        "titan.context",
        "titan.cache",
        "titan.jobs",
        "titan.limits",
        "titan.storage",
        "titan.router",
        "titan.protocol",
        "titan.observability",
    },
    "titan.cache": {"titan.storage", "titan.kernels"},
    # Conversations and retrieval: the storage protocols; the embedder and index for RAG.
    "titan.context": {"titan.storage", "titan.cache"},
    # Jobs and batches: the queue protocol; batch input and output are files.
    "titan.jobs": {"titan.storage", "titan.context"},
    "titan.storage": set(),
    # Limits use the storage protocols only, never a concrete store (see test below).
    "titan.limits": {"titan.storage"},
    "titan.backends": {"titan.protocol", "titan.observability", "titan.simulate"},
    # The load generator behind `titan bench URL`: an HTTP client of its own.
    "titan.loadgen": set(),
    # Chaos runs: their load through the load generator, faults on simulated backends.
    "titan.chaos": {"titan.loadgen", "titan.simulate"},
    # Capacity planning: pure arithmetic and a discrete-event simulation.
    "titan.planning": set(),
    "titan.cli": {
        "titan.api",
        "titan.limits",
        "titan.storage",
        "titan.loadgen",
        "titan.chaos",
        "titan.service",
        "titan.observability",
        "titan.simulate",
        "titan.planning",
        # `titan cache prepare-verifier`: the pair verifier's weights, trained ahead of serving.
        "titan.cache",
    },
}
# Only the embedded backend (embedded*.py) may import the engine (benchmarks/ is outside titan).
ENGINE_IMPORTERS = ("titan.backends.embedded",)
# Nothing imports api or cli, but the entry points and the lazy facade.
TOP_LEVEL_IMPORTERS = {"titan", "titan.__main__", "titan.cli"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def titan_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {name for name in found if name == "titan" or name.startswith("titan.")}


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def rule_violation(module: str, imported: str) -> str | None:
    package, target = package_of(module), package_of(imported)
    if target in SHARED or target == package:
        return None
    if target == "titan.engine":
        ok = module.startswith(ENGINE_IMPORTERS)
        return None if ok else "only the embedded backend may"
    if target in ("titan.api", "titan.cli"):
        return None if package in TOP_LEVEL_IMPORTERS else "nothing imports api or cli"
    if package in ("titan", "titan.__main__"):
        return None
    return None if target in ALLOWED.get(package, set()) else "outside its allowed packages"


def test_import_rules():
    violations = [
        f"{module_name(path)} imports {imported}: {why}"
        for path in modules()
        for imported in titan_imports(path)
        if (why := rule_violation(module_name(path), imported))
    ]
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("package", ["limits", "cache", "context"])
def test_state_uses_the_storage_protocols_only(package):
    for path in (PACKAGE / package).rglob("*.py"):
        stores = {i for i in titan_imports(path) if i.startswith("titan.storage")}
        # The protocols, and how a polling loop reports a store's outage: never a concrete store.
        allowed = {"titan.storage.base", "titan.storage.outage_log"}
        assert stores <= allowed, f"{module_name(path)} imports {stores}"


def test_engine_imports_nothing_from_titan_but_errors_and_the_kernels():
    for path in (PACKAGE / "engine").rglob("*.py"):
        outside = {i for i in titan_imports(path) if not i.startswith("titan.engine")}
        outside = {i for i in outside if not i.startswith("titan.kernels")}
        assert outside <= {"titan.errors"}, f"{module_name(path)} imports {outside}"


def test_the_kernels_import_nothing_from_titan():
    for path in (PACKAGE / "kernels").rglob("*.py"):
        assert (
            not titan_imports(path)
            - {"titan.kernels"}
            - {i for i in titan_imports(path) if i.startswith("titan.kernels.")}
        ), f"{module_name(path)} imports {titan_imports(path)}"


def test_the_rules_catch_violations(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from titan.api.app import create_app\nimport titan.engine.engine\n")
    assert titan_imports(bad) == {"titan.api.app", "titan.engine.engine"}
    assert rule_violation("titan.service.pipeline", "titan.engine.engine")
    assert rule_violation("titan.backends.base", "titan.api.app")
    assert rule_violation("titan.api.app", "titan.backends.embedded")
    assert rule_violation("titan.protocol.chat", "titan.service")
    assert rule_violation("titan.backends.embedded", "titan.engine.engine") is None
    assert rule_violation("titan.api.app", "titan.errors") is None


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_size(path):
    num_lines = len(path.read_text().splitlines())
    assert num_lines <= MAX_LINES, f"{path} has {num_lines} lines; split it by concept"


def test_exact_public_api():
    import titan

    assert sorted(titan.__all__) == [
        "AsyncEngine",
        "EngineConfig",
        "SamplingParams",
        "TitanConfig",
        "__version__",
        "create_app",
    ]
    for name in titan.__all__:
        assert getattr(titan, name) is not None
    with pytest.raises(AttributeError):
        _ = titan.not_a_public_name


def test_import_has_no_heavy_side_effects():
    code = (
        "import sys, titan, titan.cli.main, titan.config;"
        "heavy = {'torch', 'transformers', 'uvicorn'} & set(sys.modules);"
        "print(','.join(sorted(heavy)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def test_no_pickle_or_unsafe_yaml():
    for path in modules():
        text = path.read_text()
        assert "import pickle" not in text and "yaml.load(" not in text, path


def test_no_installed_module_reads_the_checkout():
    """tests/ and bench/ exist in a checkout, not in an installed Titan: their paths (the
    benchmarks' data and RESULTS.md) belong to benchmarks/, comments aside."""
    for path in modules():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            assert not re.search(r"[\"'](tests|bench)/", code), f"{path}:{number}: {line}"


def test_the_kernels_sources_ship_with_the_package():
    """The CPU kernels compile at run time from their C sources: a wheel without them would
    silently fall back to torch's slower path."""
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = data["package-data"]["titan.kernels"]
    kernels = PACKAGE / "kernels"
    shipped = {path for pattern in patterns for path in kernels.glob(pattern)}
    needed = {*kernels.glob("*.c"), *kernels.glob("*.h")}
    assert needed and needed <= shipped
