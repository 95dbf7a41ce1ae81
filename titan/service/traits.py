"""What routing looks at in a request: its size, its last user message, its session, its
prefix. Computed once per request, from the parsed body."""

from __future__ import annotations

from titan.protocol import ChatCompletionRequest, ClientRequest
from titan.router.registry import RequestTraits


def _message_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones
        return "".join(getattr(part, "text", "") or "" for part in content)
    return ""


def request_traits(request: ClientRequest, prefix_chars: int) -> RequestTraits:
    parsed = request.parsed
    if isinstance(parsed, ChatCompletionRequest):
        texts = [_message_text(m.content) for m in parsed.messages]
        last_user = next(
            (_message_text(m.content) for m in reversed(parsed.messages) if m.role == "user"),
            "",
        )
        prompt = "\n".join(texts)
        # What a chat template renders, near enough for prefix blocks: a role change changes
        # the prefix, as it changes the tokens.
        rendered = "".join(f"{m.role}: {t}\n" for m, t in zip(parsed.messages, texts, strict=True))
    else:
        prompts = [p for p in parsed.prompts if isinstance(p, str)]
        prompt = "\n".join(prompts)
        last_user = prompts[-1] if prompts else ""
        rendered = prompt
    session = request.headers.get("x-titan-session") or parsed.user
    return RequestTraits(
        prompt_chars=len(prompt),
        last_user_text=last_user,
        session_key=session,
        prefix_key=prompt[:prefix_chars] or None,
        prompt_text=rendered,
        is_batch=request.headers.get("x-titan-priority") == "batch",
    )
