"""A fake engine that answers with the prompt's last user message (or the completion prompt),
one character per chunk: tests steer what the model says and see what reached it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tests.api.fakes import FakeEngine
from titan.engine.outputs import FinishReason, RequestOutput
from titan.engine.sampling_params import SamplingParams


@dataclass
class EchoEngine(FakeEngine):
    max_model_len: int = 8192

    def seen_texts(self) -> list[str]:
        """Every prompt that reached the model, as text."""
        return [self.tokenizer.decode(prompt) for prompt in self.prompts_seen]

    async def _generate(
        self, request_id: str, prompt: list[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        self.running.add(request_id)
        self.prompts_seen.append(prompt)
        reply = _reply_to(self.tokenizer.decode(prompt)).encode()
        try:
            for count in range(1, min(len(reply), params.max_tokens) + 1):
                await asyncio.sleep(self.token_delay_s)
                is_finished = count == len(reply) or count == params.max_tokens
                reason = None
                if is_finished:
                    reason = FinishReason.STOP if count == len(reply) else FinishReason.LENGTH
                yield RequestOutput(
                    request_id=request_id,
                    text=bytes([reply[count - 1]]).decode(),
                    token_ids=(reply[count - 1],),
                    logprobs=None,
                    is_finished=is_finished,
                    finish_reason=reason,
                    stop_reason=None,
                    num_prompt_tokens=len(prompt),
                    num_output_tokens=count,
                    num_cached_tokens=0,
                )
        finally:
            self.running.discard(request_id)
            self.finished.append(request_id)


def _reply_to(prompt: str) -> str:
    if prompt.endswith("<assistant>"):  # the fake chat template: "<role>content\n" per message
        last_user = prompt.rsplit("<user>", 1)[-1]
        return last_user.split("\n<", 1)[0].rstrip("\n")
    return prompt
