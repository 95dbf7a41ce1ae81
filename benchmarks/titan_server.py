"""A ``titan serve`` with every default, for the benchmarks that drive it over HTTP."""

from __future__ import annotations

import os
from pathlib import Path

from titan.chaos.processes import Service, Services, free_port, titan_argv

TITAN_START_TIMEOUT_S = 300.0


def titan_environment(work_dir: Path) -> dict[str, str]:
    """``titan serve`` with every default: a home of its own (the default SQLite storage, no
    keys), the converted model and the compiled kernels from the usual cache."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    home = work_dir / "home"
    home.mkdir(parents=True, exist_ok=True)
    return {"HOME": str(home), "XDG_CACHE_HOME": cache}


def start_titan(
    services: Services, name: str, extra: list[str], environment: dict[str, str], work_dir: Path
) -> Service:
    port = free_port()
    unset = tuple(key for key in os.environ if key.startswith("TITAN_"))
    return services.start(
        name, titan_argv("serve", "--port", str(port), *extra), f"http://127.0.0.1:{port}",
        work_dir, ready_path="/ready", timeout_s=TITAN_START_TIMEOUT_S, env=environment,
        unset_env=unset, env_shown={},
    )  # fmt: skip
