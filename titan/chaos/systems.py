"""The systems of a chaos run: simulated backends (``titan simulate --allow-fault-control`` on
free ports) and Titan replicas (``titan serve --config``), started through
``titan.chaos.processes``, and the fault timeline's targets: a fault posted to a simulator's
``/simulation/faults``, a process killed (SIGKILL to its process group: a crash, not a
shutdown) and started again on the same port, with the same files."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from titan.chaos import processes
from titan.chaos.faults import canonical_target
from titan.chaos.scenario import Backend, Scenario
from titan.chaos.titan_config import titan_config
from titan.simulate.faults import Fault

SIMULATOR_START_TIMEOUT_S = 30.0
TITAN_START_TIMEOUT_S = 60.0
KILL_WAIT_S = 10.0
CONTROL_TIMEOUT_S = 5.0
# The simulators answer as any model the request names; this is only what they list.
SIMULATED_MODEL = "simulated"


@dataclass
class _Process:
    """How to start one of the run's processes, and the one running now (None: killed)."""

    name: str
    argv: list[str]
    base_url: str
    ready_path: str
    timeout_s: float
    unset_env: tuple[str, ...] = ()
    service: processes.Service | None = None
    num_starts: int = 0


class ChaosSystems:
    """Starts and stops the run's processes; the fault timeline's ``FaultTargets``."""

    def __init__(self, scenario: Scenario, workspace: Path):
        self.scenario = scenario
        self.workspace = workspace
        self.log_dir = workspace / "logs"
        self._processes: dict[str, _Process] = {}
        self.backend_urls: dict[str, str] = {}  # name -> root URL (no /v1): /stats, faults
        self.replica_urls: dict[str, str] = {}  # "titan-1" -> root URL
        self.titan_configs: dict[str, dict[str, object]] = {}

    # ---- start and stop (blocking: called from a thread, or before the loop) -------------

    def start_all(self, on_event: Callable[[str], None] = lambda message: None) -> None:
        """Backends first (in parallel), then the Titan replicas (which probe them)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        upstreams: dict[str, str] = {}
        for backend in self.scenario.backends:
            if backend.is_simulated:
                process = self._simulator(backend)
                self._processes[backend.name] = process
                self.backend_urls[backend.name] = process.base_url
                upstreams[backend.name] = f"{process.base_url}/v1"
            else:
                url = backend.url or ""
                upstreams[backend.name] = url
                if backend.fault_control:
                    self.backend_urls[backend.name] = url.rstrip("/").removesuffix("/v1")
        self._start_in_parallel(list(self._processes.values()), on_event)
        replicas = [self._replica(name, upstreams) for name in self.scenario.replica_names()]
        self._processes.update({replica.name: replica for replica in replicas})
        self._start_in_parallel(replicas, on_event)

    def stop_all(self) -> None:
        """Every process at once (each stop may wait for a graceful exit)."""
        services = [p.service for p in self._processes.values() if p.service is not None]
        if services:
            with ThreadPoolExecutor(max_workers=len(services)) as pool:
                list(pool.map(processes.stop, services))

    def commands(self) -> dict[str, str]:
        return {name: " ".join(process.argv) for name, process in self._processes.items()}

    def _simulator(self, backend: Backend) -> _Process:
        port = processes.free_port()
        profile_path = self.workspace / f"{backend.name}.profile.yaml"
        profile = backend.simulated.model_dump(mode="json") if backend.simulated else {}
        profile_path.write_text(yaml.safe_dump(profile, sort_keys=False))
        argv = processes.titan_argv(
            "simulate",
            "--port",
            str(port),
            "--profile",
            str(profile_path),
            "--model",
            SIMULATED_MODEL,
            "--allow-fault-control",
        )
        if backend.max_concurrency is not None:
            argv += ["--max-concurrency", str(backend.max_concurrency)]
        url = f"http://127.0.0.1:{port}"
        return _Process(backend.name, argv, url, "/health", SIMULATOR_START_TIMEOUT_S)

    def _replica(self, name: str, upstreams: dict[str, str]) -> _Process:
        port = processes.free_port()
        config = titan_config(self.scenario, upstreams, port)
        self.titan_configs[name] = config
        path = self.workspace / f"{name}.titan.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        argv = processes.titan_argv("serve", "--config", str(path))
        url = f"http://127.0.0.1:{port}"
        self.replica_urls[name] = url
        # Where it listens comes from its file: the caller's overrides of it would lose it.
        unset = ("TITAN_SERVER__HOST", "TITAN_SERVER__PORT")
        return _Process(name, argv, url, "/ready", TITAN_START_TIMEOUT_S, unset)

    def _start_in_parallel(self, chosen: list[_Process], on_event: Callable[[str], None]) -> None:
        if not chosen:
            return
        with ThreadPoolExecutor(max_workers=len(chosen)) as pool:
            for process in pool.map(self._start, chosen):
                on_event(f"started {process.name} ({process.base_url})")

    def _start(self, process: _Process) -> _Process:
        if _is_running(process):
            return process
        process.num_starts += 1
        # Each start has its own log: a restart must not overwrite what the crash left.
        log_name = (
            process.name if process.num_starts == 1 else f"{process.name}.{process.num_starts}"
        )
        process.service = processes.start(
            log_name,
            process.argv,
            process.base_url,
            self.log_dir,
            ready_path=process.ready_path,
            timeout_s=process.timeout_s,
            unset_env=process.unset_env,
        )
        return process

    # ---- FaultTargets ----------------------------------------------------------------------

    async def inject(self, target: str, fault: Fault) -> None:
        url = self.backend_urls[target] + "/simulation/faults"
        async with httpx.AsyncClient(timeout=CONTROL_TIMEOUT_S) as client:
            response = await client.post(url, content=fault.model_dump_json())
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}: {response.text[:200]}")

    async def kill(self, target: str) -> None:
        process = self._processes[canonical_target(target)]
        service = process.service
        if service is None or service.process is None or not _is_running(process):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.process.pid, signal.SIGKILL)  # its own group (start_new_session)
        await asyncio.to_thread(service.process.wait, KILL_WAIT_S)

    async def start(self, target: str) -> None:
        await asyncio.to_thread(self._start, self._processes[canonical_target(target)])


def _is_running(process: _Process) -> bool:
    service = process.service
    return service is not None and service.process is not None and service.process.poll() is None
