"""The embedded backend: OpenAI requests served by the in-process engine (titan.engine), one
engine request per choice (runs.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

from titan.backends.concurrency import closing_stream, gather_all, merge
from titan.backends.embedded.call_cut import cut_repeated_calls
from titan.backends.embedded.choices import (
    beam_search_options,
    best_choices,
    check_beam_params,
    fill_from_beams,
    num_sampled_choices,
)
from titan.backends.embedded.convert import chat_logprobs, completion_logprobs, finish_reason
from titan.backends.embedded.engine_handle import (
    EngineFactory,
    EngineHandle,
    default_conversation_window,
    engine_config,
    prompt_tokens,
    start_engine,
)
from titan.backends.embedded.runs import (
    ChoiceResult,
    ChoiceRun,
    chat_runs,
    completion_runs,
    usage_of,
)
from titan.backends.embedded.tool_parser import choice_message, tool_finish_reason
from titan.backends.embedded.tool_stream import ToolCallStream
from titan.backends.embedded.tools import tool_plan
from titan.config import EmbeddedDeployment, EmbeddedModelConfig
from titan.engine.outputs import RequestOutput
from titan.engine.sampling_params import BeamSearchParams
from titan.errors import EngineError, ServiceUnavailableError
from titan.protocol import (
    Answer,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ClientRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    ModelCard,
    Usage,
    make_id,
)

SYSTEM_FINGERPRINT = "fp_titan_embedded"


class EmbeddedBackend:
    """Serves the one model the embedded engine loads. See titan.backends.base.Backend."""

    def __init__(
        self,
        deployment: EmbeddedDeployment | EmbeddedModelConfig,
        *,
        model_name: str | None = None,
        name: str = "embedded",
        engine_factory: EngineFactory = start_engine,
    ):
        embedded = deployment if isinstance(deployment, EmbeddedDeployment) else None
        config = embedded.engine if embedded else deployment
        self._max_tool_calls = (embedded or EmbeddedDeployment()).max_tool_calls
        if model_name is not None and config.served_model_name is None:
            config = config.model_copy(update={"served_model_name": model_name})
        self._config = config
        self._name = name
        self._engine_config = engine_config(config)
        self._engine_factory = engine_factory
        self._engine: EngineHandle | None = None  # once started
        self._created = int(time.time())

    # ---- lifecycle -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def model_ids(self) -> tuple[str, ...]:
        return (self._engine.model_name,) if self._engine is not None else ()

    async def probe(self) -> None:
        self._running_engine()  # in-process: alive while it is loaded

    async def complete(self, request: ClientRequest) -> Answer:
        if request.endpoint == "chat":
            return await self.chat_completion(request.parsed, request.shift_scope)  # type: ignore[arg-type]
        return await self.completion(request.parsed)  # type: ignore[arg-type]

    def stream(self, request: ClientRequest) -> AsyncIterator[Answer]:
        if request.endpoint == "chat":
            return self.chat_completion_stream(request.parsed, request.shift_scope)  # type: ignore[arg-type]
        return self.completion_stream(request.parsed)  # type: ignore[arg-type]

    @property
    def is_ready(self) -> bool:
        return self._engine is not None

    async def start(self) -> None:
        self._engine = await self._engine_factory(self._engine_config)
        self._created = int(time.time())

    async def shutdown(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.shutdown()

    def model_card(self, model_id: str) -> ModelCard:
        engine = self._running_engine()
        return ModelCard(
            id=model_id,
            created=self._created,
            root=self._config.model or engine.model_name,
            max_model_len=engine.max_model_len,
        )

    def conversation_window(self) -> int:
        """Most tokens a conversation keeps unless the config says (engine_handle.py)."""
        return default_conversation_window(self._running_engine())

    def count_prompt_tokens(self, messages: list[dict[str, Any]]) -> int:
        return prompt_tokens(self._running_engine(), messages)  # what trimming budgets against

    def stats(self) -> dict[str, Any]:
        engine = self._running_engine()
        stats = engine.stats()
        return {
            **{k: v for k, v in asdict(stats).items() if k != "extra"},
            "kv_cache_usage": stats.kv_cache_usage,
            "num_active_streams": engine.num_active_streams,
        }

    def _running_engine(self) -> EngineHandle:
        engine = self._engine
        if engine is None:
            raise ServiceUnavailableError("The embedded model is not loaded yet; retry shortly.")
        return engine

    # ---- requests → engine runs ----------------------------------------------------------

    async def _outputs(
        self, engine: EngineHandle, run: ChoiceRun, beam: BeamSearchParams | None = None
    ) -> AsyncIterator[RequestOutput]:
        """The engine's outputs for one run; leaving early closes (and so aborts) it."""
        # Only when set: engines that know none of them (test fakes) serve plain requests.
        named = {"share_prompt_with": run.share_prompt_with, "shift_scope": run.shift_scope}
        options: dict[str, Any] = {name: value for name, value in named.items() if value}
        if beam is not None:
            options["beam"] = beam
        stream = engine.generate(
            run.request_id, run.prompt_token_ids, run.params, priority=run.priority, **options
        )
        async with closing_stream(stream):
            outputs = cut_repeated_calls(stream) if run.cuts_repeated_calls else stream
            async for output in outputs:
                yield output
                if output.is_finished:
                    return
        raise EngineError(f"The engine ended request {run.request_id} without finishing it.")

    async def _run_to_end(self, engine: EngineHandle, run: ChoiceRun) -> ChoiceResult:
        result = ChoiceResult()
        text_parts = []
        async with closing_stream(self._outputs(engine, run)) as outputs:
            async for output in outputs:
                text_parts.append(output.text)
                if output.logprobs:
                    result.logprobs.extend(output.logprobs)
                result.finish_reason = finish_reason(output.finish_reason)
                result.num_output_tokens = output.num_output_tokens
                result.num_cached_tokens = output.num_cached_tokens
        result.text = "".join(text_parts)
        return result

    async def _run_all(self, engine: EngineHandle, runs: list[ChoiceRun]) -> list[ChoiceResult]:
        return await gather_all([self._run_to_end(engine, run) for run in runs])

    async def _run_choices(
        self,
        engine: EngineHandle,
        runs: list[ChoiceRun],
        request: ChatCompletionRequest | CompletionRequest,
    ) -> tuple[list[ChoiceRun], list[ChoiceResult]]:
        """Run the choices; best_of keeps the n best, beam search fills n choices per prompt."""
        beam = beam_search_options(request)
        if beam is None:
            results = await self._run_all(engine, runs)
            if num_sampled_choices(request) > request.n:
                return best_choices(runs, results, request.n)
            return runs, results
        check_beam_params([run.params for run in runs])
        results = [ChoiceResult() for _ in runs]
        firsts = [index for index, run in enumerate(runs) if run.share_prompt_with is None]
        outputs = await gather_all([self._run_beam(engine, runs[i], beam) for i in firsts])
        for first, output in zip(firsts, outputs, strict=True):
            fill_from_beams(output, results[first : first + request.n])
        return runs, results

    async def _run_beam(
        self, engine: EngineHandle, run: ChoiceRun, beam: BeamSearchParams
    ) -> RequestOutput:
        async with closing_stream(self._outputs(engine, run, beam)) as outputs:
            async for output in outputs:
                if output.is_finished:
                    return output
        raise EngineError(f"The engine ended request {run.request_id} without finishing it.")

    def _merged_outputs(
        self, engine: EngineHandle, runs: list[ChoiceRun]
    ) -> AsyncIterator[tuple[int, RequestOutput]]:
        return merge([self._outputs(engine, run) for run in runs])

    # ---- chat ------------------------------------------------------------------------------

    async def chat_completion(
        self, request: ChatCompletionRequest, shift_scope: str | None = None
    ) -> ChatCompletion:
        engine = self._running_engine()
        request_id = make_id("chatcmpl")
        plan = tool_plan(request, self._max_tool_calls)
        runs = chat_runs(engine, request, request_id, plan, shift_scope)
        runs, results = await self._run_choices(engine, runs, request)
        choices = []
        for run, result in zip(runs, results, strict=True):
            # Each choice's reply is read for tool calls on its own.
            message, reason = choice_message(plan, result.text, result.finish_reason)
            choices.append(
                ChatCompletionChoice(
                    index=run.choice_index,
                    message=message,
                    logprobs=chat_logprobs(result.logprobs) if request.logprobs else None,
                    finish_reason=reason,
                )
            )
        return ChatCompletion(
            id=request_id,
            created=int(time.time()),
            model=engine.model_name,
            choices=choices,
            usage=usage_of(runs, results),
            system_fingerprint=SYSTEM_FINGERPRINT,
        )

    async def chat_completion_stream(
        self, request: ChatCompletionRequest, shift_scope: str | None = None
    ) -> AsyncIterator[ChatCompletionChunk]:
        engine = self._running_engine()
        request_id = make_id("chatcmpl")
        plan = tool_plan(request, self._max_tool_calls)
        runs = chat_runs(engine, request, request_id, plan, shift_scope)
        created = int(time.time())

        def chunk(
            choices: list[ChatChunkChoice], usage: Usage | None = None
        ) -> ChatCompletionChunk:
            return ChatCompletionChunk(
                id=request_id,
                created=created,
                model=engine.model_name,
                choices=choices,
                usage=usage,
                system_fingerprint=SYSTEM_FINGERPRINT,
            )

        results = [ChoiceResult() for _ in runs]
        tool_streams = [ToolCallStream(plan) for _ in runs]
        has_sent_roles = False
        async with closing_stream(self._merged_outputs(engine, runs)) as outputs:
            async for run_index, output in outputs:
                # The role chunks wait for the engine's first output, so that an error the
                # engine raises at once still reaches the client as a plain HTTP error.
                if not has_sent_roles:
                    has_sent_roles = True
                    for run in runs:
                        role_delta = ChatDelta(role="assistant", content="")
                        yield chunk([ChatChunkChoice(index=run.choice_index, delta=role_delta)])
                result = results[run_index]
                result.num_output_tokens = output.num_output_tokens
                result.num_cached_tokens = output.num_cached_tokens
                reason = finish_reason(output.finish_reason)
                tool_stream = tool_streams[run_index]
                # Text a tool call may be starting in is held back by the tool stream.
                deltas = tool_stream.feed(output.text)
                if reason:
                    deltas += tool_stream.finish()
                    calls = tool_stream.num_calls > 0
                    reason = tool_finish_reason(reason, calls, is_forced=plan.is_forced)
                if not (deltas or output.logprobs or reason):
                    continue  # text held back (a possible stop string or tool call, half a char)
                logprobs = chat_logprobs(output.logprobs or ()) if request.logprobs else None
                deltas = deltas or [ChatDelta()]
                for position, delta in enumerate(deltas):
                    is_last = position == len(deltas) - 1
                    yield chunk(
                        [
                            ChatChunkChoice(
                                index=runs[run_index].choice_index,
                                delta=delta,
                                logprobs=logprobs if position == 0 else None,
                                finish_reason=reason if is_last else None,
                            )
                        ]
                    )
        if request.include_usage:
            yield chunk([], usage=usage_of(runs, results))

    # ---- completions -----------------------------------------------------------------------

    async def completion(self, request: CompletionRequest) -> Completion:
        engine = self._running_engine()
        request_id = make_id("cmpl")
        runs, prompt_texts = completion_runs(engine, request, request_id)
        runs, results = await self._run_choices(engine, runs, request)
        choices = []
        for run, result in zip(runs, results, strict=True):
            prefix = prompt_texts[run.prompt_index] if request.echo else ""
            logprobs = None
            if request.logprobs is not None:
                logprobs, _ = completion_logprobs(result.logprobs, len(prefix))
            choices.append(
                CompletionChoice(
                    index=run.choice_index,
                    text=prefix + result.text,
                    logprobs=logprobs,
                    finish_reason=result.finish_reason,
                )
            )
        return Completion(
            id=request_id,
            created=int(time.time()),
            model=engine.model_name,
            choices=choices,
            usage=usage_of(runs, results),
            system_fingerprint=SYSTEM_FINGERPRINT,
        )

    async def completion_stream(self, request: CompletionRequest) -> AsyncIterator[Completion]:
        engine = self._running_engine()
        request_id = make_id("cmpl")
        runs, prompt_texts = completion_runs(engine, request, request_id)
        created = int(time.time())

        def chunk(choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
            return Completion(
                id=request_id,
                created=created,
                model=engine.model_name,
                choices=choices,
                usage=usage,
                system_fingerprint=SYSTEM_FINGERPRINT,
            )

        results = [ChoiceResult() for _ in runs]
        has_echoed = [not request.echo] * len(runs)
        text_offsets = [0] * len(runs)
        async with closing_stream(self._merged_outputs(engine, runs)) as outputs:
            async for run_index, output in outputs:
                run = runs[run_index]
                result = results[run_index]
                result.num_output_tokens = output.num_output_tokens
                result.num_cached_tokens = output.num_cached_tokens
                text = output.text
                if not has_echoed[run_index]:
                    has_echoed[run_index] = True
                    text = prompt_texts[run.prompt_index] + text
                reason = finish_reason(output.finish_reason)
                if not (text or output.logprobs or reason):
                    continue
                logprobs = None
                if request.logprobs is not None:
                    logprobs, text_offsets[run_index] = completion_logprobs(
                        output.logprobs or (), text_offsets[run_index]
                    )
                yield chunk(
                    [
                        CompletionChoice(
                            index=run.choice_index,
                            text=text,
                            logprobs=logprobs,
                            finish_reason=reason,
                        )
                    ]
                )
        if request.include_usage:
            yield chunk([], usage=usage_of(runs, results))
