"""The engine as the embedded backend sees it (``EngineHandle``: what it uses of
``titan.engine.AsyncEngine``), how it starts one, and what the request path asks of its model
(how much of a conversation to keep, how many tokens a prompt takes).

A Protocol rather than AsyncEngine itself: test fakes stand in for the engine, and importing
AsyncEngine at run time pulls in torch and the model code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from titan.config import EmbeddedModelConfig
from titan.engine.config import EngineConfig

if TYPE_CHECKING:
    from titan.engine.async_engine import AsyncEngine
    from titan.engine.beam_search import BeamSearchParams
    from titan.engine.outputs import EngineStats, RequestOutput
    from titan.engine.sampling_params import SamplingParams
    from titan.engine.tokenizer import Tokenizer


class EngineHandle(Protocol):
    model_name: str
    max_model_len: int
    device_type: str  # where the model runs: "cpu", "cuda"
    tokenizer: Tokenizer

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
    ) -> AsyncIterator[RequestOutput]: ...

    def stats(self) -> EngineStats: ...

    @property
    def num_active_streams(self) -> int: ...

    async def shutdown(self) -> None: ...


EngineFactory = Callable[[EngineConfig], Awaitable[EngineHandle]]

# Most tokens a server-side conversation keeps when the engine runs on a CPU and
# context.conversation_window is unset. A turn's attention grows with the context it attends to:
# on 2 cores a ~650-token turn over ~7,000 earlier tokens takes 2.5-3.6x the first turn, over ~3,300
# about 1.7-2x (docs/ARCHITECTURE.md, "How much a conversation keeps"). Ollama and LM Studio give
# models this context by default too.
CPU_CONVERSATION_WINDOW = 4096


def default_conversation_window(engine: EngineHandle) -> int:
    """The engine's window, capped at CPU_CONVERSATION_WINDOW on a CPU."""
    if engine.device_type == "cpu":
        return min(engine.max_model_len, CPU_CONVERSATION_WINDOW)
    return engine.max_model_len


async def start_engine(config: EngineConfig) -> AsyncEngine:
    # Imported here: it pulls in torch and the model code, which a fake engine does not need.
    from titan.engine.async_engine import AsyncEngine

    return await AsyncEngine.start(config)


def engine_config(config: EmbeddedModelConfig) -> EngineConfig:
    """Titan's model settings as the engine's config (raises ConfigError on bad values)."""
    return EngineConfig(**config.explicit_settings())


def prompt_tokens(engine: EngineHandle, messages: list[dict[str, Any]]) -> int:
    """Tokens of ``messages`` as the engine's model sees them: the chat template applied, encoded
    with its own tokenizer."""
    text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return len(engine.tokenizer.encode(text, add_special_tokens=False))
