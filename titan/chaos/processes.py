"""Subprocesses of a chaos run (also used by the repository's benchmarks and end-to-end tests):
simulated upstreams, ``titan serve`` and other servers, each started in its own session with its
output in a log file, waited for until an HTTP path answers 200, and stopped (SIGINT, then SIGKILL
to its process group) however the run ends. Also free ports and peak resident memory (VmHWM) from
/proc."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READY_POLL_S = 0.1
STOP_TIMEOUT_S = 10.0
LOG_TAIL_CHARS = 3000


class ServiceError(RuntimeError):
    """A service would not start: the message says which, why, and ends with its log's tail."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def titan_argv(*args: str) -> list[str]:
    """``titan ARGS`` with this interpreter, so the benchmark measures the Titan it runs in."""
    return [sys.executable, "-m", "titan", *args]


@dataclass
class Service:
    name: str
    argv: list[str]
    base_url: str
    log_path: Path
    env_shown: dict[str, str] = field(default_factory=dict)  # what the report may print
    process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise ServiceError(f"{self.name} is not running")
        return self.process.pid

    @property
    def command(self) -> str:
        env = " ".join(f"{key}={shlex.quote(value)}" for key, value in self.env_shown.items())
        return f"{env} {shlex.join(self.argv)}".strip()

    def log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-LOG_TAIL_CHARS:]


def start(
    name: str,
    argv: Sequence[str],
    base_url: str,
    log_dir: Path,
    *,
    ready_path: str,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    unset_env: Sequence[str] = (),
    env_shown: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Service:
    """Start ``argv`` and wait until GET ``base_url + ready_path`` answers 200. ``env`` is added
    to this process's environment, ``unset_env`` taken out of it; ``env_shown`` is the part a
    report may show."""
    log_path = log_dir / f"{name}.log"
    environ = {**os.environ, **(env or {})}
    for variable in unset_env:
        environ.pop(variable, None)
    service = Service(name, list(argv), base_url, log_path, dict(env_shown or {}))
    with log_path.open("wb") as log:
        service.process = subprocess.Popen(
            service.argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environ,
            cwd=cwd,
            start_new_session=True,  # its own process group: stop() reaches its children too
        )
    try:
        wait_ready(service, ready_path, timeout_s)
    except BaseException:
        stop(service)
        raise
    return service


def wait_ready(service: Service, path: str, timeout_s: float) -> None:
    process = service.process
    if process is None:
        raise ServiceError(f"{service.name} was never started")
    deadline = time.monotonic() + timeout_s
    while True:
        code = process.poll()
        if code is not None:
            raise ServiceError(
                f"{service.name} exited with {code} while starting: {service.command}\n"
                f"--- its log ({service.log_path}) ends with:\n{service.log_tail()}"
            )
        if _answers_ok(service.base_url + path):
            return
        if time.monotonic() > deadline:
            raise ServiceError(
                f"{service.name} was not ready after {timeout_s:.0f} s: {service.command}\n"
                f"--- its log ({service.log_path}) ends with:\n{service.log_tail()}"
            )
        time.sleep(READY_POLL_S)


def _answers_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def get_json(url: str, timeout_s: float = 5.0) -> object:
    import orjson

    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return orjson.loads(response.read())


def stop(service: Service) -> None:
    """SIGINT (a graceful shutdown), then SIGKILL to the process group it leads."""
    process = service.process
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # its own group (start_new_session)
        process.wait(timeout=STOP_TIMEOUT_S)
    # Children a graceful exit left behind (e.g. uvicorn workers) go with the group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


class Services:
    """Every service started through it is stopped when the ``with`` block ends."""

    def __init__(self) -> None:
        self._started: list[Service] = []

    def __enter__(self) -> Services:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()

    def start(self, *args: Any, **kwargs: Any) -> Service:
        """``start(...)``, remembered for stopping."""
        service = start(*args, **kwargs)
        self._started.append(service)
        return service

    def stop_all(self) -> None:
        while self._started:
            stop(self._started.pop())


def _descendants(pid: int) -> Iterator[int]:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            yield child
            yield from _descendants(child)


def _status_kib(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_mib(pid: int) -> float | None:
    """The peak resident memory (VmHWM) of ``pid`` plus that of each of its descendants (an
    upper bound of their peak together); None where /proc cannot tell (not Linux)."""
    if not Path(f"/proc/{pid}/status").exists():
        return None
    total_kib = sum(_status_kib(p, "VmHWM") for p in (pid, *_descendants(pid)))
    return total_kib / 1024
