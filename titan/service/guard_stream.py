"""The output guardrails on a stream of chat or completion chunks.

Each choice (n > 1: each independently) has its own scanner: a chunk's text goes out at once
except the shortest tail that could still become a match, which waits for the next chunk (so a
card number or a key split across chunks is still caught) and is flushed with the choice's
finish. A ``block`` ends that choice with ``finish_reason: "content_filter"``; when every choice
is blocked the upstream stream is closed (its generation aborted).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from titan.protocol import Answer, ClientRequest, RawJSON, answer_bytes
from titan.service.guard_policies import Policy
from titan.service.guard_text import ChoiceScanner, Outcome
from titan.service.streaming import close_stream

CONTENT_FILTER = "content_filter"


async def guard_stream(
    stream: AsyncIterator[Answer],
    policies: tuple[Policy, ...],
    request: ClientRequest,
    model: str,
    *,
    record: Callable[[Outcome, str], None],
    on_block: Callable[[], None],
) -> AsyncIterator[Answer]:
    num_choices = _num_choices(request)
    text_key = "content" if request.endpoint == "chat" else "text"
    scanners: dict[int, ChoiceScanner] = {}
    done: set[int] = set()  # choices finished or blocked: their later pieces are dropped
    num_blocked = 0
    template: dict[str, Any] | None = None
    try:
        async for chunk in stream:
            body = orjson.loads(answer_bytes(chunk))
            choices = body.get("choices")
            if not choices:  # the usage chunk, an error: nothing to check
                yield chunk
                continue
            template = body
            kept = []
            for choice in choices:
                index = choice.get("index", 0)
                if index in done:
                    continue
                scanner = scanners.get(index)
                if scanner is None:
                    scanner = scanners[index] = ChoiceScanner(policies, "output", model)
                holder = choice.get("delta") if request.endpoint == "chat" else choice
                holder = holder if isinstance(holder, dict) else {}
                piece = holder.get(text_key)
                is_final = choice.get("finish_reason") is not None
                outcome = await scanner.feed(piece if isinstance(piece, str) else "",
                                             is_final=is_final)  # fmt: skip
                record(outcome, "output")
                # Logprobs would spell out what is held back or removed.
                choice["logprobs"] = None
                if outcome.text or isinstance(piece, str):
                    holder[text_key] = outcome.text
                if outcome.blocked_by is not None:
                    choice["finish_reason"] = CONTENT_FILTER
                    done.add(index)
                    num_blocked += 1
                    on_block()
                elif is_final:
                    done.add(index)
                if _carries_something(choice, holder, text_key):
                    kept.append(choice)
            if kept:
                body["choices"] = kept
                yield RawJSON(orjson.dumps(body))
            if num_blocked >= num_choices:
                return  # nothing more may reach the client: stop the generation
        # A stream that ended without finishing a choice (cut short): what was held goes out.
        for index, scanner in scanners.items():
            if index in done or template is None:
                continue
            outcome = await scanner.feed("", is_final=True)
            record(outcome, "output")
            if outcome.blocked_by is not None:
                on_block()
            if outcome.text or outcome.blocked_by is not None:
                yield RawJSON(orjson.dumps(_tail_chunk(template, index, outcome, request)))
    finally:
        await close_stream(stream)


def _num_choices(request: ClientRequest) -> int:
    """Choices the stream carries: n per prompt (a completion may send several prompts)."""
    n = max(1, int(getattr(request.parsed, "n", 1) or 1))
    prompt = request.body.get("prompt") if request.endpoint == "completion" else None
    is_batch = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))
    return n * len(prompt) if is_batch else n  # type: ignore[arg-type]


def _carries_something(choice: dict[str, Any], holder: dict[str, Any], text_key: str) -> bool:
    """A choice whose text is all held back and that says nothing else is not sent."""
    if choice.get("finish_reason") is not None or holder.get(text_key):
        return True
    return any(key != text_key and value is not None for key, value in holder.items()) and (
        holder is not choice
    )


def _tail_chunk(
    template: dict[str, Any], index: int, outcome: Outcome, request: ClientRequest
) -> dict[str, Any]:
    finish = CONTENT_FILTER if outcome.blocked_by is not None else None
    if request.endpoint == "chat":
        choice: dict[str, Any] = {"index": index, "delta": {"content": outcome.text}}
    else:
        choice = {"index": index, "text": outcome.text}
    choice |= {"logprobs": None, "finish_reason": finish}
    return {**{k: v for k, v in template.items() if k != "usage"}, "choices": [choice]}
