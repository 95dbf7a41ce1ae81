"""Where the engine runs: the device, the dtype, and the attention kernel for them."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from titan.engine.config import EngineConfig
from titan.engine.kernels.cpu_attention import CpuPagedAttention, build_library
from titan.engine.model.config import ModelConfig

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    # Measured on AVX512-BF16 CPUs: bfloat16 matmuls run ~2x float32 (bench/RESULTS.md).
    return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else torch.float32


def attention_kernel(
    config: EngineConfig,
    model_config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    kernel_dir: Path,
) -> CpuPagedAttention | None:
    """Titan's C kernel on CPUs where it builds and fits the model; None: torch SDPA."""
    if device.type != "cpu" or not config.use_cpu_kernels:
        return None
    library = build_library(kernel_dir)
    if library is None:
        return None
    kernel = CpuPagedAttention(library, config.resolved_num_threads())
    if not kernel.supports(
        dtype,
        model_config.num_attention_heads,
        model_config.num_key_value_heads,
        model_config.head_dim,
        config.block_size,
    ):
        log.warning("the CPU attention kernel does not fit this model; using torch SDPA")
        return None
    return kernel
