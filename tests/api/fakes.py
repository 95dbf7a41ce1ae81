"""A fake embedded engine with the AsyncEngine interface and deterministic outputs.

Tokens are UTF-8 bytes (ids 0-255) plus BOS=256 and EOS=257; the reply is a fixed text, one
token per output, so tests can predict text, token counts and finish reasons exactly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from titan.engine.config import EngineConfig
from titan.engine.outputs import EngineStats, FinishReason, RequestOutput, TokenLogprob, TopLogprob
from titan.engine.sampling_params import SamplingParams
from titan.errors import ContextLengthExceededError, EngineError, ServiceUnavailableError

BOS, EOS = 256, 257
REPLY = "Hello from the fake engine!"
PREFIX_BLOCK = 16


class FakeTokenizer:
    eos_token_ids = (EOS,)
    bos_token_id = BOS
    vocab_size = 258

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = list(text.encode())
        return [BOS, *ids] if add_special_tokens else ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(token for token in token_ids if token < 256).decode(errors="replace")

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        text = "".join(f"<{message['role']}>{message['content']}\n" for message in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def _logprob(token_id: int, k: int) -> TokenLogprob:
    token = bytes([token_id]).decode(errors="replace")
    top = tuple(
        TopLogprob(token_id=alt, token=chr(alt), token_bytes=bytes([alt]), logprob=-1.0 - j)
        for j, alt in enumerate(range(ord("a"), ord("a") + k))
    )
    return TokenLogprob(
        token_id=token_id, token=token, token_bytes=bytes([token_id]), logprob=-0.5, top=top
    )


@dataclass
class FakeEngine:
    model_name: str = "fake-model"
    max_model_len: int = 256
    device_type: str = "cpu"
    token_delay_s: float = 0.0
    fail_after_tokens: int | None = None  # raise EngineError after this many tokens
    start_gate: asyncio.Event | None = None  # start() waits for it (to test /ready)
    start_error: Exception | None = None
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    config: EngineConfig | None = None
    running: set[str] = field(default_factory=set)
    finished: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    params_seen: list[SamplingParams] = field(default_factory=list)
    prompts_seen: list[list[int]] = field(default_factory=list)
    priorities_seen: list[int] = field(default_factory=list)
    is_shut_down: bool = False
    _seen_prompts: set[tuple[int, ...]] = field(default_factory=set)

    async def factory(self, config: EngineConfig) -> FakeEngine:
        """Stands in for AsyncEngine.start."""
        self.config = config
        if self.start_gate is not None:
            await self.start_gate.wait()
        if self.start_error is not None:
            raise self.start_error
        if config.max_model_len is not None:
            self.max_model_len = config.max_model_len
        if config.served_model_name is not None:
            self.model_name = config.served_model_name
        return self

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        **options: object,  # share_prompt_with, beam: the real engine's, ignored here
    ) -> AsyncIterator[RequestOutput]:
        if self.is_shut_down:
            raise ServiceUnavailableError("engine is shut down")
        total = len(prompt_token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise ContextLengthExceededError(
                f"prompt {len(prompt_token_ids)} + max_tokens {params.max_tokens} > "
                f"{self.max_model_len}"
            )
        self.priorities_seen.append(priority)
        return self._generate(request_id, list(prompt_token_ids), params)

    async def _generate(
        self, request_id: str, prompt: list[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        self.running.add(request_id)
        self.params_seen.append(params)
        self.prompts_seen.append(prompt)
        num_cached = (len(prompt) - 1) // PREFIX_BLOCK * PREFIX_BLOCK
        num_cached = num_cached if tuple(prompt) in self._seen_prompts else 0
        self._seen_prompts.add(tuple(prompt))
        reply = list(REPLY.encode())
        is_done = False
        try:
            for count in range(1, params.max_tokens + 1):
                if self.fail_after_tokens is not None and count > self.fail_after_tokens:
                    raise EngineError("the fake engine failed on purpose")
                await asyncio.sleep(self.token_delay_s)
                token = reply[(count - 1) % len(reply)]
                is_last_of_reply = count == len(reply)
                is_finished = is_last_of_reply or count == params.max_tokens
                reason = None
                if is_finished:
                    reason = FinishReason.STOP if is_last_of_reply else FinishReason.LENGTH
                    is_done = True  # as the real engine: closing after the last output is no abort
                yield RequestOutput(
                    request_id=request_id,
                    text=bytes([token]).decode(),
                    token_ids=(token,),
                    logprobs=None
                    if params.logprobs is None
                    else (_logprob(token, params.logprobs),),
                    is_finished=is_finished,
                    finish_reason=reason,
                    stop_reason=None,
                    num_prompt_tokens=len(prompt),
                    num_output_tokens=count,
                    num_cached_tokens=num_cached,
                )
                if is_finished:
                    return
        finally:
            self.running.discard(request_id)
            (self.finished if is_done else self.aborted).append(request_id)

    def abort(self, request_id: str) -> None:
        self.running.discard(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(num_running=len(self.running), num_requests_aborted=len(self.aborted))

    @property
    def num_active_streams(self) -> int:
        return len(self.running)

    async def shutdown(self) -> None:
        self.is_shut_down = True
