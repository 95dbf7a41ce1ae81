"""Building the engine: the model and tokenizer, the device, the form the weights run in and on
which kernels, and the KV cache's size. Everything here is decided once, at start.

The weights run in one of two forms:
- quantized (the default for a GGUF file on CPU): the file's own Q4_1/Q8_0 blocks (or float
  weights quantized to Q8_0 with ``quantization="q8_0"``), a whole step per call into the C
  kernels, activations in float32 and the KV cache in float16;
- torch: dense weights in the chosen dtype (what an explicit ``dtype`` asks for, what HF
  directories and CUDA get), with the C paged-attention kernel on CPU.

The choice, and why, is logged at start and kept in ``BuiltModel.description``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from titan.engine.config import EngineConfig
from titan.engine.cpu_attention import CpuPagedAttention
from titan.engine.device import resolve_device, resolve_dtype
from titan.engine.model.config import ModelConfig
from titan.engine.model.llama import LlamaForCausalLM
from titan.engine.model.loader import ModelSource, load_config, load_weights, resolve_model
from titan.engine.model.quantized import (
    BLOCKS_FILE,
    KV_DTYPE,
    QuantizedLlama,
    can_quantize,
    load_quantized,
)
from titan.engine.runner import KVCacheSpec
from titan.engine.tokenizer import Tokenizer
from titan.errors import ConfigError
from titan.kernels.build import build_library
from titan.kernels.library import CpuKernels

log = logging.getLogger(__name__)


@dataclass
class BuiltModel:
    model: LlamaForCausalLM | QuantizedLlama
    kv_dtype: torch.dtype
    attention: CpuPagedAttention | None  # the torch path's attention kernel
    kernels: CpuKernels | None
    description: str  # "Q4_1 blocks, avx512-vnni kernels, 2 threads"

    @property
    def kv_code_bytes(self) -> int:
        """The int8 attention unit's KV codes beside the KV cache, per token, head and layer."""
        return self.model.kv_code_bytes if isinstance(self.model, QuantizedLlama) else 0

    def close(self) -> None:
        if self.kernels is not None:
            self.kernels.close()


@dataclass
class BuiltEngine:
    model_name: str
    hf_dir: Path  # the model as an HF directory (a GGUF file is converted once, then cached)
    tokenizer: Tokenizer
    model: BuiltModel
    kv_spec: KVCacheSpec
    num_kv_blocks: int
    # The model's context window, capped by the config and shrunk to what the KV cache holds.
    max_model_len: int


def build_engine(config: EngineConfig) -> BuiltEngine:
    torch.set_num_threads(config.resolved_num_threads())
    source = resolve_model(config.model, config.resolved_cache_dir() / "models")
    model_config = load_config(source.hf_dir)
    device = resolve_device(config.device)
    max_model_len = min(
        config.max_model_len or model_config.max_position_embeddings,
        model_config.max_position_embeddings,
    )
    tokenizer = Tokenizer(source.hf_dir, model_config.eos_token_ids, model_config.bos_token_id)
    model = build_model(config, source, model_config, device, max_model_len)
    spec = KVCacheSpec(
        num_layers=model_config.num_hidden_layers,
        num_kv_heads=model_config.num_key_value_heads,
        head_dim=model_config.head_dim,
        block_size=config.block_size,
        dtype=model.kv_dtype,
        kv_code_bytes=model.kv_code_bytes,
    )
    num_blocks = config.num_kv_blocks or max(2, config.kv_cache_bytes // spec.bytes_per_block)
    capacity = num_blocks * config.block_size
    if capacity < max_model_len:
        # A sequence longer than the whole cache could never run: the window shrinks to fit.
        log.warning(
            "the KV cache holds %d tokens, fewer than the context window (%d): serving a "
            "%d-token window; raise --kv-cache-memory to serve the full one",
            capacity,
            max_model_len,
            capacity,
        )
        max_model_len = capacity
    return BuiltEngine(
        model_name=config.served_model_name or source.name,
        hf_dir=source.hf_dir,
        tokenizer=tokenizer,
        model=model,
        kv_spec=spec,
        num_kv_blocks=num_blocks,
        max_model_len=max_model_len,
    )


def build_model(
    config: EngineConfig,
    source: ModelSource,
    model_config: ModelConfig,
    device: torch.device,
    max_model_len: int,
) -> BuiltModel:
    has_blocks = (source.hf_dir / BLOCKS_FILE).exists()
    wants = _wanted_quantization(config, device, has_blocks)
    kernels = _kernels(config, device, num_threads=_kernel_threads(config, wants is not None))
    if wants is not None:
        why_not = _why_not_quantized(device, kernels, model_config)
        if why_not is None:
            weights = load_quantized(
                source.hf_dir, model_config, use_file_blocks=wants == "auto" and has_blocks
            )
            reduced = (  # the reduced units take head dims 64 at a time (attention.c)
                config.attention_precision == "auto"
                and kernels.has_reduced_attention
                and model_config.head_dim % 64 == 0
            )
            model = QuantizedLlama(
                model_config, weights, kernels, max_model_len, config.block_size, reduced
            )
            attention = kernels.reduced_attention_kind if reduced else "float32"
            description = (
                f"{weights.formats()} weights ({weights.num_bytes / 2**20:.0f} MiB), "
                f"{kernels.isa} kernels, {kernels.num_threads} threads, attention {attention}"
            )
            return BuiltModel(model, KV_DTYPE, None, kernels, description)
        if config.quantization != "auto":
            raise ConfigError(f"quantization {config.quantization!r} is not possible: {why_not}")
        log.info("quantized weights off (%s): the torch path serves", why_not)
    dtype = resolve_dtype(config.dtype, device)
    model = LlamaForCausalLM(
        model_config, load_weights(source.hf_dir), device, dtype, max_model_len
    )
    attention = _attention(config, kernels, model_config, dtype)
    description = f"torch {str(dtype).removeprefix('torch.')} on {device}"
    if attention is not None and kernels is not None:
        description += f", {kernels.isa} attention kernel, {kernels.num_threads} threads"
    elif kernels is not None:
        kernels.close()
        kernels = None
    return BuiltModel(model, dtype, attention, kernels, description)


def _wanted_quantization(
    config: EngineConfig, device: torch.device, has_blocks: bool
) -> str | None:
    """``"auto"`` (the file's blocks), ``"q8_0"``, or None (dense weights in torch)."""
    if config.quantization == "none":
        return None
    if config.quantization == "q8_0":
        return "q8_0"
    # auto: a GGUF file's own blocks on CPU, unless a dtype was asked for (dense weights).
    if device.type != "cpu" or not has_blocks or config.dtype != "auto":
        return None
    return "auto"


def _kernel_threads(config: EngineConfig, is_quantized: bool) -> int:
    if config.num_threads is not None:
        return config.num_threads
    if is_quantized:
        # The pool hands work out item by item, so the HTTP loop taking a core back costs one
        # item's wait, not a stalled barrier (measured: docs/ARCHITECTURE.md).
        return os.cpu_count() or 1
    return config.resolved_num_threads()


def _kernels(config: EngineConfig, device: torch.device, num_threads: int) -> CpuKernels | None:
    if device.type != "cpu" or not config.use_cpu_kernels:
        return None
    library = build_library(config.resolved_cache_dir() / "kernels")
    return None if library is None else CpuKernels(library, num_threads)


def _why_not_quantized(
    device: torch.device, kernels: CpuKernels | None, model_config: ModelConfig
) -> str | None:
    if device.type != "cpu":
        return f"the quantized kernels run on CPU, not {device}"
    if kernels is None:
        return "the CPU kernels could not be built (no C compiler?)"
    return can_quantize(model_config)


def _attention(
    config: EngineConfig,
    kernels: CpuKernels | None,
    model_config: ModelConfig,
    dtype: torch.dtype,
) -> CpuPagedAttention | None:
    if kernels is None:
        return None
    attention = CpuPagedAttention(kernels)
    if not attention.supports(
        dtype,
        model_config.num_attention_heads,
        model_config.num_key_value_heads,
        model_config.head_dim,
        config.block_size,
    ):
        log.warning("the CPU attention kernel does not fit this model; using torch SDPA")
        return None
    return attention
