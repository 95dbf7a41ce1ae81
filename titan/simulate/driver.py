"""Runs a simulated model server (titan.simulate.model_server) on a clock, for the HTTP server.

One task sleeps until the step under way ends, advances the server to the clock, and wakes the
requests that got tokens. The server's own times stay exact whatever the event loop's lag: each
step starts when the last one ended, and ``advance`` catches up with every step due.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from titan.simulate.kv_blocks import PromptTokens, render_prompt, tokenize
from titan.simulate.model_server import ModelServer, Sequence


class ServerDriver:
    def __init__(
        self,
        server: ModelServer,
        now: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.server = server
        self._now = now
        self._sleep = sleep
        self._wake = asyncio.Event()
        self._changed: dict[int, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None

    def submit(self, prompt: PromptTokens, num_output: int) -> Sequence:
        """Queues a request now. Raises RequestTooLong (see ModelServer.submit)."""
        now = self._now()
        self._notify(self.server.advance(now))
        sequence = self.server.submit(prompt, num_output, now)
        self._changed[sequence.id] = asyncio.Event()
        if self._task is None:  # started by the first request: no lifespan needed
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._wake.set()
        return sequence

    async def until_generated(self, sequence: Sequence, num_tokens: int) -> None:
        """Returns once ``sequence`` has ``num_tokens`` output tokens (or has finished)."""
        changed = self._changed[sequence.id]
        while sequence.num_generated < min(num_tokens, sequence.num_output):
            await changed.wait()
            changed.clear()

    def release(self, sequence: Sequence) -> None:
        """The request is over (answered, or its client left): unfinished work is aborted."""
        if not sequence.is_finished:
            self.server.abort(sequence)
        self._changed.pop(sequence.id, None)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            self._notify(self.server.advance(self._now()))
            end_s = self.server.next_step_end_s
            self._wake.clear()
            if end_s is None:
                await self._wake.wait()  # idle until a request comes
                continue
            delay = end_s - self._now()
            await self._sleep(delay if delay > 0 else 0)

    def _notify(self, sequences: Iterable[Sequence]) -> None:
        for sequence in sequences:
            changed = self._changed.get(sequence.id)
            if changed is not None:
                changed.set()


class ServerTimeline:
    """A Pacer's interface (titan.simulate.pacing) over the model server: tokens come when its
    steps make them, not at planned times."""

    def __init__(self, driver: ServerDriver, sequence: Sequence):
        self._driver = driver
        self.sequence = sequence

    async def until_token(self, token_index: int) -> None:
        await self._driver.until_generated(self.sequence, token_index + 1)

    async def until_finish(self) -> None:
        await self._driver.until_generated(self.sequence, self.sequence.num_output)

    @property
    def num_prompt_tokens(self) -> int:
        return self.sequence.num_prompt_tokens

    async def attend(self, answering: Awaitable[None]) -> None:
        """Runs the answer; then (or when its client leaves) the sequence is released."""
        try:
            await answering
        finally:
            self._driver.release(self.sequence)


def queue_request(driver: ServerDriver, body: Mapping[str, Any], num_output: int) -> ServerTimeline:
    """A request body's prompt, tokenized and queued. Raises RequestTooLong."""
    prompt = tokenize(render_prompt(body), driver.server.profile.block_size)
    return ServerTimeline(driver, driver.submit(prompt, num_output))
