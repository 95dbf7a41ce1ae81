"""Usage of an answer (for token limits and accounting), and the replies admission gives itself.

A whole answer carries its usage. A stream carries it only in a final chunk when the client asked
for ``stream_options.include_usage`` (or the backend sends it anyway); otherwise each content
chunk counts as one token, which is what vLLM, SGLang, TGI and the embedded engine send.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from titan.protocol import (
    Answer,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatDelta,
    ChatMessage,
    ClientRequest,
    Completion,
    CompletionChoice,
    RawJSON,
    Usage,
    make_id,
)

UsageCounts = tuple[int, int]  # (prompt tokens, completion tokens)


def usage_of(answer: Answer) -> UsageCounts | None:
    if isinstance(answer, RawJSON):
        if b'"usage"' not in answer.data:  # the hot path: most stream chunks have none
            return None
        try:
            usage = answer.parsed().get("usage")
        except (ValueError, AttributeError):
            return None
        if not isinstance(usage, dict):
            return None
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and isinstance(completion, int):
            return prompt, completion
        return None
    usage = getattr(answer, "usage", None)
    if isinstance(usage, Usage):
        return usage.prompt_tokens, usage.completion_tokens
    return None


class StreamMeter:
    """Counts a stream's chunks and keeps the usage of the last chunk that had one."""

    def __init__(self, estimated_prompt_tokens: int):
        self.estimated_prompt_tokens = estimated_prompt_tokens
        self.num_chunks = 0
        self.usage: UsageCounts | None = None

    def see(self, chunk: Answer) -> None:
        self.num_chunks += 1
        usage = usage_of(chunk)
        if usage is not None:
            self.usage = usage

    def result(self) -> UsageCounts | None:
        if self.usage is not None:
            return self.usage
        if not self.num_chunks:
            return None
        return self.estimated_prompt_tokens, self.num_chunks


def canned_answer(request: ClientRequest, model: str, text: str) -> Answer:
    """A whole answer with ``text`` (cache-only degradation's configured reply)."""
    created = int(time.time())
    usage = Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0)
    if request.endpoint == "chat":
        return ChatCompletion(
            id=make_id("chatcmpl"),
            created=created,
            model=model,
            choices=[
                ChatCompletionChoice(
                    index=0, message=ChatMessage(content=text), finish_reason="stop"
                )
            ],
            usage=usage,
        )
    return Completion(
        id=make_id("cmpl"),
        created=created,
        model=model,
        choices=[CompletionChoice(index=0, text=text, finish_reason="stop")],
        usage=usage,
    )


async def canned_stream(request: ClientRequest, model: str, text: str) -> AsyncIterator[Answer]:
    """The same reply as a stream: one content chunk, then the finish."""
    whole = canned_answer(request, model, text)
    if request.endpoint != "chat":
        yield whole  # a completion chunk has the same shape as the whole completion
        return
    common = {"id": whole.id, "created": whole.created, "model": model}  # type: ignore[union-attr]
    yield ChatCompletionChunk(
        **common,
        choices=[ChatChunkChoice(index=0, delta=ChatDelta(role="assistant", content=text))],
    )
    yield ChatCompletionChunk(
        **common, choices=[ChatChunkChoice(index=0, delta=ChatDelta(), finish_reason="stop")]
    )
