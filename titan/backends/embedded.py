"""The embedded backend: OpenAI requests served by the in-process engine (titan.engine)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from titan.backends.concurrency import closing_stream, gather_all, merge
from titan.backends.embedded_convert import (
    chat_logprobs,
    chat_messages,
    check_chat_supported,
    check_completion_supported,
    choice_seed,
    completion_logprobs,
    finish_reason,
    resolve_max_tokens,
    sampling_params,
)
from titan.config import EmbeddedModelConfig
from titan.engine.config import EngineConfig
from titan.engine.outputs import RequestOutput, TokenLogprob
from titan.engine.sampling import SamplingParams
from titan.errors import EngineError, InvalidRequestError, ServiceUnavailableError
from titan.protocol import (
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatMessage,
    Completion,
    CompletionChoice,
    CompletionRequest,
    ModelCard,
    Usage,
    make_id,
)

if TYPE_CHECKING:
    from titan.engine.async_engine import AsyncEngine

SYSTEM_FINGERPRINT = "fp_titan_embedded"

EngineFactory = Callable[[EngineConfig], Awaitable["AsyncEngine"]]


async def start_engine(config: EngineConfig) -> AsyncEngine:
    # Imported here: it pulls in torch and the model code, which a fake engine does not need.
    from titan.engine.async_engine import AsyncEngine

    return await AsyncEngine.start(config)


def engine_config(config: EmbeddedModelConfig) -> EngineConfig:
    """Titan's model settings as the engine's config (raises ConfigError on bad values)."""
    return EngineConfig(**config.explicit_settings())


@dataclass(frozen=True)
class _Job:
    """One engine request: one choice of one prompt."""

    choice_index: int  # prompt_index * n + i
    prompt_index: int
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0


@dataclass
class _ChoiceResult:
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0


def _usage(jobs: list[_Job], results: list[_ChoiceResult]) -> Usage:
    """Prompt tokens once per prompt (not once per choice), completion tokens summed.

    The n choices of a prompt share it, and only one of them had to compute it: the prompt's
    cached count is the smallest any of its choices saw.
    """
    num_prompt_tokens: dict[int, int] = {}
    num_cached_tokens: dict[int, int] = {}
    for job, result in zip(jobs, results, strict=True):
        num_prompt_tokens[job.prompt_index] = len(job.prompt_token_ids)
        previous = num_cached_tokens.get(job.prompt_index, result.num_cached_tokens)
        num_cached_tokens[job.prompt_index] = min(previous, result.num_cached_tokens)
    return Usage.of(
        sum(num_prompt_tokens.values()),
        sum(result.num_output_tokens for result in results),
        sum(num_cached_tokens.values()),
    )


class EmbeddedBackend:
    """Serves the one model the embedded engine loads. See titan.backends.base.Backend."""

    def __init__(
        self, config: EmbeddedModelConfig, *, engine_factory: EngineFactory = start_engine
    ):
        self._config = config
        self._engine_config = engine_config(config)
        self._engine_factory = engine_factory
        self._engine: Any = None  # AsyncEngine once started (Any: fakes stand in for it)
        self._created = int(time.time())

    # ---- lifecycle -----------------------------------------------------------------------

    @property
    def model_ids(self) -> tuple[str, ...]:
        return (self._engine.model_name,) if self._engine is not None else ()

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

    def stats(self) -> dict[str, Any]:
        engine = self._running_engine()
        stats = engine.stats()
        return {
            **{k: v for k, v in asdict(stats).items() if k != "extra"},
            "kv_cache_usage": stats.kv_cache_usage,
            "num_active_streams": engine.num_active_streams,
        }

    def _running_engine(self) -> Any:
        engine = self._engine
        if engine is None:
            raise ServiceUnavailableError("The embedded model is not loaded yet; retry shortly.")
        return engine

    # ---- requests → engine jobs ----------------------------------------------------------

    def _chat_jobs(
        self, engine: Any, request: ChatCompletionRequest, request_id: str
    ) -> list[_Job]:
        check_chat_supported(request)
        tokenizer = engine.tokenizer
        text = tokenizer.apply_chat_template(chat_messages(request), add_generation_prompt=True)
        prompt_ids = tokenizer.encode(text, add_special_tokens=False)
        max_tokens = resolve_max_tokens(
            request.max_output_tokens, len(prompt_ids), engine.max_model_len, "messages"
        )
        return [
            _Job(
                choice_index=i,
                prompt_index=0,
                request_id=f"{request_id}-{i}",
                prompt_token_ids=prompt_ids,
                params=sampling_params(
                    request,
                    max_tokens=max_tokens,
                    num_logprobs=request.num_logprobs,
                    seed=choice_seed(request.seed, i),
                ),
                priority=request.priority,
            )
            for i in range(request.n)
        ]

    def _completion_prompt(self, engine: Any, prompt: str | list[int]) -> list[int]:
        tokenizer = engine.tokenizer
        if isinstance(prompt, str):
            # As vLLM: a raw prompt gets the tokenizer's special tokens (BOS, if it has one).
            token_ids = tokenizer.encode(prompt, add_special_tokens=True)
        else:
            out_of_range = [token for token in prompt if token >= tokenizer.vocab_size]
            if out_of_range:
                raise InvalidRequestError(
                    f"Invalid value for 'prompt': token id {out_of_range[0]} is out of range "
                    f"(the vocabulary has {tokenizer.vocab_size} tokens).",
                    param="prompt",
                )
            token_ids = prompt
        if not token_ids:
            raise InvalidRequestError("Invalid value for 'prompt': it is empty.", param="prompt")
        return token_ids

    def _completion_jobs(
        self, engine: Any, request: CompletionRequest, request_id: str
    ) -> tuple[list[_Job], list[str]]:
        """The jobs, and each prompt's text (for echo)."""
        check_completion_supported(request)
        jobs: list[_Job] = []
        prompt_texts: list[str] = []
        for prompt_index, prompt in enumerate(request.prompts):
            prompt_ids = self._completion_prompt(engine, prompt)
            if isinstance(prompt, str):
                prompt_texts.append(prompt)
            else:
                prompt_texts.append(engine.tokenizer.decode(prompt) if request.echo else "")
            max_tokens = resolve_max_tokens(
                request.max_tokens, len(prompt_ids), engine.max_model_len, "prompt"
            )
            for i in range(request.n):
                params = sampling_params(
                    request,
                    max_tokens=max_tokens,
                    num_logprobs=request.logprobs,
                    seed=choice_seed(request.seed, i),
                )
                choice_index = prompt_index * request.n + i
                job_id = f"{request_id}-{choice_index}"
                jobs.append(
                    _Job(choice_index, prompt_index, job_id, prompt_ids, params, request.priority)
                )
        return jobs, prompt_texts

    # ---- running jobs ----------------------------------------------------------------------

    async def _outputs(self, engine: Any, job: _Job) -> AsyncIterator[RequestOutput]:
        """The engine's outputs for one job; leaving early closes (and so aborts) it."""
        stream = engine.generate(
            job.request_id, job.prompt_token_ids, job.params, priority=job.priority
        )
        async with closing_stream(stream):
            async for output in stream:
                yield output
                if output.is_finished:
                    return
        raise EngineError(f"The engine ended request {job.request_id} without finishing it.")

    async def _run_to_end(self, engine: Any, job: _Job) -> _ChoiceResult:
        result = _ChoiceResult()
        text_parts = []
        async with closing_stream(self._outputs(engine, job)) as outputs:
            async for output in outputs:
                text_parts.append(output.text)
                if output.logprobs:
                    result.logprobs.extend(output.logprobs)
                result.finish_reason = finish_reason(output.finish_reason)
                result.num_output_tokens = output.num_output_tokens
                result.num_cached_tokens = output.num_cached_tokens
        result.text = "".join(text_parts)
        return result

    async def _run_all(self, engine: Any, jobs: list[_Job]) -> list[_ChoiceResult]:
        return await gather_all([self._run_to_end(engine, job) for job in jobs])

    def _merged_outputs(
        self, engine: Any, jobs: list[_Job]
    ) -> AsyncIterator[tuple[int, RequestOutput]]:
        return merge([self._outputs(engine, job) for job in jobs])

    # ---- chat ------------------------------------------------------------------------------

    async def chat_completion(self, request: ChatCompletionRequest) -> ChatCompletion:
        engine = self._running_engine()
        request_id = make_id("chatcmpl")
        jobs = self._chat_jobs(engine, request, request_id)
        results = await self._run_all(engine, jobs)
        return ChatCompletion(
            id=request_id,
            created=int(time.time()),
            model=engine.model_name,
            choices=[
                ChatCompletionChoice(
                    index=job.choice_index,
                    message=ChatMessage(content=result.text),
                    logprobs=chat_logprobs(result.logprobs) if request.logprobs else None,
                    finish_reason=result.finish_reason,
                )
                for job, result in zip(jobs, results, strict=True)
            ],
            usage=_usage(jobs, results),
            system_fingerprint=SYSTEM_FINGERPRINT,
        )

    async def chat_completion_stream(
        self, request: ChatCompletionRequest
    ) -> AsyncIterator[ChatCompletionChunk]:
        engine = self._running_engine()
        request_id = make_id("chatcmpl")
        jobs = self._chat_jobs(engine, request, request_id)
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

        results = [_ChoiceResult() for _ in jobs]
        has_sent_roles = False
        async with closing_stream(self._merged_outputs(engine, jobs)) as outputs:
            async for job_index, output in outputs:
                # The role chunks wait for the engine's first output, so that an error the
                # engine raises at once still reaches the client as a plain HTTP error.
                if not has_sent_roles:
                    has_sent_roles = True
                    for job in jobs:
                        role_delta = ChatDelta(role="assistant", content="")
                        yield chunk([ChatChunkChoice(index=job.choice_index, delta=role_delta)])
                result = results[job_index]
                result.num_output_tokens = output.num_output_tokens
                result.num_cached_tokens = output.num_cached_tokens
                reason = finish_reason(output.finish_reason)
                if not (output.text or output.logprobs or reason):
                    continue  # text held back (a possible stop string, half a character)
                logprobs = chat_logprobs(output.logprobs or ()) if request.logprobs else None
                delta = ChatDelta(content=output.text or None)
                yield chunk(
                    [
                        ChatChunkChoice(
                            index=jobs[job_index].choice_index,
                            delta=delta,
                            logprobs=logprobs,
                            finish_reason=reason,
                        )
                    ]
                )
        if request.include_usage:
            yield chunk([], usage=_usage(jobs, results))

    # ---- completions -----------------------------------------------------------------------

    async def completion(self, request: CompletionRequest) -> Completion:
        engine = self._running_engine()
        request_id = make_id("cmpl")
        jobs, prompt_texts = self._completion_jobs(engine, request, request_id)
        results = await self._run_all(engine, jobs)
        choices = []
        for job, result in zip(jobs, results, strict=True):
            prefix = prompt_texts[job.prompt_index] if request.echo else ""
            logprobs = None
            if request.logprobs is not None:
                logprobs, _ = completion_logprobs(result.logprobs, len(prefix))
            choices.append(
                CompletionChoice(
                    index=job.choice_index,
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
            usage=_usage(jobs, results),
            system_fingerprint=SYSTEM_FINGERPRINT,
        )

    async def completion_stream(self, request: CompletionRequest) -> AsyncIterator[Completion]:
        engine = self._running_engine()
        request_id = make_id("cmpl")
        jobs, prompt_texts = self._completion_jobs(engine, request, request_id)
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

        results = [_ChoiceResult() for _ in jobs]
        has_echoed = [not request.echo] * len(jobs)
        text_offsets = [0] * len(jobs)
        async with closing_stream(self._merged_outputs(engine, jobs)) as outputs:
            async for job_index, output in outputs:
                job = jobs[job_index]
                result = results[job_index]
                result.num_output_tokens = output.num_output_tokens
                result.num_cached_tokens = output.num_cached_tokens
                text = output.text
                if not has_echoed[job_index]:
                    has_echoed[job_index] = True
                    text = prompt_texts[job.prompt_index] + text
                reason = finish_reason(output.finish_reason)
                if not (text or output.logprobs or reason):
                    continue
                logprobs = None
                if request.logprobs is not None:
                    logprobs, text_offsets[job_index] = completion_logprobs(
                        output.logprobs or (), text_offsets[job_index]
                    )
                yield chunk(
                    [
                        CompletionChoice(
                            index=job.choice_index,
                            text=text,
                            logprobs=logprobs,
                            finish_reason=reason,
                        )
                    ]
                )
        if request.include_usage:
            yield chunk([], usage=_usage(jobs, results))
