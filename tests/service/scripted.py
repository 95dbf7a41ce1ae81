"""A backend that plays a script of behaviours, for the attempt runner's tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from titan.errors import UpstreamError
from titan.protocol import Answer, ClientRequest, RawJSON


@dataclass
class Step:
    """One attempt's behaviour: wait ``delay_s``, then fail with ``status`` or answer; streams
    send ``num_chunks`` chunks ``gap_s`` apart, and go silent after ``stall_after`` chunks."""

    delay_s: float = 0.0
    status: int | None = None
    retry_after: float | None = None
    num_chunks: int = 3
    gap_s: float = 0.0
    stall_after: int | None = None


def ok(delay_s: float = 0.0, **kwargs: Any) -> Step:
    return Step(delay_s=delay_s, **kwargs)


def fail(status: int, delay_s: float = 0.0, retry_after: float | None = None) -> Step:
    return Step(delay_s=delay_s, status=status, retry_after=retry_after)


def hang() -> Step:
    return Step(delay_s=3600.0)


@dataclass
class ScriptedBackend:
    name: str
    script: list[Step] = field(default_factory=list)
    default: Step = field(default_factory=Step)
    calls: int = 0
    cancelled: int = 0
    closed_streams: int = 0
    is_ready: bool = True

    @property
    def model_ids(self) -> tuple[str, ...]:
        return ("m",)

    def _next(self) -> Step:
        self.calls += 1
        return self.script.pop(0) if self.script else self.default

    async def _wait(self, step: Step) -> None:
        try:
            await asyncio.sleep(step.delay_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if step.status is not None:
            raise UpstreamError(
                f"{self.name} says {step.status}",
                status_code=step.status,
                is_retryable=step.status >= 500 or step.status == 429,
                retry_after=step.retry_after,
            )

    async def complete(self, request: ClientRequest) -> Answer:
        await self._wait(self._next())
        return RawJSON(f'{{"from": "{self.name}"}}'.encode())

    async def stream(self, request: ClientRequest) -> AsyncIterator[Answer]:
        step = self._next()
        try:
            await self._wait(step)
            for index in range(step.num_chunks):
                if step.stall_after is not None and index == step.stall_after:
                    await asyncio.sleep(3600)
                if index:
                    await asyncio.sleep(step.gap_s)
                yield RawJSON(f'{{"from": "{self.name}", "chunk": {index}}}'.encode())
        finally:
            self.closed_streams += 1

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    async def probe(self) -> None: ...

    def stats(self) -> dict[str, Any]:
        return {"calls": self.calls}
