"""The engine as the embedded backend sees it (``EngineHandle``: what it uses of
``titan.engine.AsyncEngine``), and how it starts one.

A Protocol rather than AsyncEngine itself: test fakes stand in for the engine, and importing
AsyncEngine at run time pulls in torch and the model code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

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


async def start_engine(config: EngineConfig) -> AsyncEngine:
    # Imported here: it pulls in torch and the model code, which a fake engine does not need.
    from titan.engine.async_engine import AsyncEngine

    return await AsyncEngine.start(config)


def engine_config(config: EmbeddedModelConfig) -> EngineConfig:
    """Titan's model settings as the engine's config (raises ConfigError on bad values)."""
    return EngineConfig(**config.explicit_settings())
