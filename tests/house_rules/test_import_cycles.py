"""No import circles in titan or benchmarks: every import, at module level or inside a function,
counts (a circle broken only by a late import is still a circle of concepts)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("titan", "benchmarks")


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, name: str, known: set[str]) -> set[str]:
    """The known modules ``path`` imports (``from pkg import mod`` names the module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if module in known and module != name}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    paths = {
        module_name(p, root): p for package in PACKAGES for p in (root / package).rglob("*.py")
    }
    return {name: imported(path, name, set(paths)) for name, path in paths.items()}


def test_no_import_circles():
    try:
        TopologicalSorter(import_graph()).prepare()
    except CycleError as error:
        raise AssertionError(f"an import circle: {' -> '.join(error.args[1])}") from None


def test_a_circle_is_found(tmp_path: Path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "titan" / "a.py").write_text("from titan import b\n")
    (tmp_path / "titan" / "b.py").write_text("def f():\n    from titan.a import x\n")
    graph = import_graph(tmp_path)
    assert graph["titan.a"] == {"titan.b"} and graph["titan.b"] == {"titan.a"}
