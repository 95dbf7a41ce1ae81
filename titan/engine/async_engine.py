"""AsyncEngine: the engine's step loop in a background thread, one asyncio queue per request.

The event loop never runs model code: it validates, enqueues a command and awaits its queue.
The step thread drains commands between steps and hands each step's outputs back to the loop in
one ``call_soon_threadsafe`` call, so the HTTP side stays responsive while the engine is saturated.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from titan.engine.config import EngineConfig
from titan.engine.engine import Engine
from titan.engine.outputs import EngineStats, RequestOutput
from titan.engine.sampling_params import BeamSearchParams, SamplingParams
from titan.engine.tokenizer import Tokenizer
from titan.errors import EngineError, InvalidRequestError, ServiceUnavailableError, TitanError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    share_prompt_with: str | None = None
    beam: BeamSearchParams | None = None
    shift_scope: str | None = None


@dataclass(frozen=True)
class _Abort:
    request_id: str


_STOP = object()


class AsyncEngine:
    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop):
        self.engine = engine
        self.model_name: str = engine.model_name
        self.max_model_len: int = engine.max_model_len
        self.device_type: str = engine.device_type
        self.tokenizer: Tokenizer = engine.tokenizer
        self._loop = loop
        self._streams: dict[str, asyncio.Queue[RequestOutput | TitanError]] = {}
        self._commands: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._is_stopped = False
        self._thread = threading.Thread(target=self._run, name="titan-engine", daemon=True)

    @classmethod
    async def start(cls, config: EngineConfig) -> AsyncEngine:
        loop = asyncio.get_running_loop()
        engine = await loop.run_in_executor(None, _load_and_warm_up, config)
        self = cls(engine, loop)
        self._thread.start()
        return self

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        *,
        share_prompt_with: str | None = None,
        beam: BeamSearchParams | None = None,
        shift_scope: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Validate and enqueue now (raising TitanError at once), then stream outputs.

        share_prompt_with: a request with the same prompt (n > 1) whose prompt KV this one forks.
        beam: run a beam search instead; one finished output carries the ``beams``.
        shift_scope: the conversation the request continues (context shift, Engine.add_request).
        """
        if self._is_stopped:
            raise ServiceUnavailableError("The engine is shutting down.")
        self.engine.validate_prompt(prompt_token_ids, params)
        if request_id in self._streams:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        stream: asyncio.Queue[RequestOutput | TitanError] = asyncio.Queue()
        self._streams[request_id] = stream
        self._commands.put(
            _Add(
                request_id,
                list(prompt_token_ids),
                params,
                priority,
                share_prompt_with,
                beam,
                shift_scope,
            )
        )
        return self._stream(request_id, stream)

    async def _stream(
        self, request_id: str, stream: asyncio.Queue[RequestOutput | TitanError]
    ) -> AsyncIterator[RequestOutput]:
        is_finished = False
        try:
            while True:
                item = await stream.get()
                if isinstance(item, TitanError):
                    is_finished = True
                    raise item
                is_finished = item.is_finished
                yield item
                if is_finished:
                    return
        finally:
            # Closed early (client gone, task cancelled): free the request's blocks.
            self._streams.pop(request_id, None)
            if not is_finished:
                self._commands.put(_Abort(request_id))

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))

    def stats(self) -> EngineStats:
        return self.engine.stats()

    @property
    def num_active_streams(self) -> int:
        return len(self._streams)

    async def shutdown(self) -> None:
        if self._is_stopped:
            return
        self._is_stopped = True
        self._commands.put(_STOP)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        for stream in self._streams.values():
            stream.put_nowait(ServiceUnavailableError("The engine shut down."))

    # ---- the step thread --------------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        while True:
            block = not engine.has_unfinished
            try:
                command = self._commands.get(block=block)
            except queue.Empty:
                command = None
            while command is not None:
                if command is _STOP:
                    self._abort_all()
                    return
                self._apply(command)
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = None
            if not engine.has_unfinished:
                continue
            try:
                outputs = engine.step()
            except Exception:
                log.exception("engine step failed; failing the requests in flight")
                self._fail_all()
                continue
            if outputs:
                self._loop.call_soon_threadsafe(self._deliver, outputs)

    def _apply(self, command: object) -> None:
        if isinstance(command, _Add):
            try:
                if command.beam is not None:
                    self.engine.add_beam_search(
                        command.request_id,
                        command.prompt_token_ids,
                        command.params,
                        command.beam,
                        command.priority,
                    )
                else:
                    self.engine.add_request(
                        command.request_id,
                        command.prompt_token_ids,
                        command.params,
                        command.priority,
                        share_prompt_with=command.share_prompt_with,
                        shift_scope=command.shift_scope,
                    )
            except TitanError as exc:
                self._loop.call_soon_threadsafe(self._deliver_error, command.request_id, exc)
        elif isinstance(command, _Abort):
            self.engine.abort_request(command.request_id)

    def _abort_all(self) -> None:
        for request_id in self.engine.request_ids():
            self.engine.abort_request(request_id)

    def _fail_all(self) -> None:
        failed = self.engine.request_ids()
        self._abort_all()
        for request_id in failed:
            error = EngineError("The engine failed while running this request; it was aborted.")
            self._loop.call_soon_threadsafe(self._deliver_error, request_id, error)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.put_nowait(output)

    def _deliver_error(self, request_id: str, error: TitanError) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.put_nowait(error)


def _load_and_warm_up(config: EngineConfig) -> Engine:
    """Load the model and run one short request, so the first real one pays no one-time costs."""
    engine = Engine(config)
    prompt = engine.tokenizer.encode("Warm-up: count from one to ten.")
    engine.add_request("__warmup__", prompt, SamplingParams(max_tokens=4, temperature=0.0))
    while engine.has_unfinished:
        engine.step()
    engine.reset_stats()
    return engine
