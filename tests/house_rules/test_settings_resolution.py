"""Commands read settings one way only: ``titan.config.resolution.resolve_settings`` (the
defaults, ``--config``, ``TITAN_*`` variables, flags). A command that read the environment, a
config file or a typer ``envvar`` itself would honour a setting that another command ignores,
which is how ``titan keys`` once wrote keys where ``titan serve`` never looked."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ROOT / "titan" / "cli"
# The one module that reads the environment and config files for commands (with the loading
# code it calls), and modules that read variables that are not Titan's settings.
ENVIRONMENT_READERS = {
    "titan/config/loading.py": "the default environment of the loader",
    "titan/config/resolution.py": "the one way commands resolve settings",
    "titan/engine/config.py": "XDG_CACHE_HOME, where converted models are cached",
    "titan/kernels/build.py": "CC, the C compiler to build the kernels with; XDG_CACHE_HOME",
    "titan/observability/metrics.py": "PROMETHEUS_MULTIPROC_DIR, prometheus-client's own",
    "titan/chaos/processes.py": "the environment of the processes a chaos run starts",
}
LOADERS = {"load_config", "config_from_mapping", "layered_config", "read_config_file"}
RESOLVERS = {
    "resolve_settings",
    "serve_settings",
    "worker_settings",
    "storage_settings",
    "client_settings",
}


def python_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def reads_environment(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in ("environ", "getenv") for alias in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg == "envvar":
            lines.append(node.lineno)  # typer/click reading a variable behind the resolver
    return lines


def called_names(node: ast.AST) -> set[str]:
    names = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            func = call.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def test_only_the_resolver_reads_the_environment():
    found = []
    for path in python_files(ROOT / "titan"):
        relative = str(path.relative_to(ROOT))
        if relative in ENVIRONMENT_READERS:
            continue
        for line in reads_environment(ast.parse(path.read_text())):
            found.append(f"{relative}:{line}")
    assert not found, f"read settings through titan.config.resolution instead: {found}"


def test_commands_never_load_config_files_themselves():
    found = [
        f"{path.relative_to(ROOT)}: {sorted(called_names(ast.parse(path.read_text())) & LOADERS)}"
        for path in python_files(COMMANDS)
        if called_names(ast.parse(path.read_text())) & LOADERS
    ]
    assert not found, f"commands resolve settings with resolve_settings: {found}"


def test_every_command_with_a_config_option_resolves_its_settings():
    """A function taking ``config_file`` (the ``--config`` option) calls the resolver."""
    found = []
    for path in python_files(COMMANDS):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            arguments = [arg.arg for arg in node.args.args + node.args.kwonlyargs]
            if "config_file" in arguments and not called_names(node) & (RESOLVERS | {"_client"}):
                found.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert not found, f"these take --config but never call resolve_settings: {found}"


def test_the_guard_sees_each_way_of_reading_around_the_resolver():
    code = (
        "import os\nfrom os import environ\nimport typer\n"
        "a = os.environ['TITAN_STORAGE']\nb = os.getenv('X')\n"
        "c = typer.Option(None, envvar='TITAN_URL')\n"
    )
    assert reads_environment(ast.parse(code)) == [2, 4, 5, 6]
