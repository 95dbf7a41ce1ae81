"""``/v1/models``: the model cards a server lists."""

from __future__ import annotations

from typing import Literal

from titan.protocol.common import ResponseModel


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "titan"
    root: str | None = None
    max_model_len: int | None = None  # vLLM's extension: the context window in tokens


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
