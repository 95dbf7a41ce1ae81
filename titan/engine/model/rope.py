"""Rotary position embeddings with the model's theta and scaling (none, linear, llama3)."""

from __future__ import annotations

import math

import torch

from titan.engine.model.config import ModelConfig
from titan.errors import ModelLoadError


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    dim = config.head_dim
    # float32 like HF transformers, so that float32 outputs match the reference bit for bit.
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2).float() / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        return _llama3(inv_freq, scaling)
    raise ModelLoadError(f"rope scaling {kind!r} is not supported (default, linear, llama3 are)")


def _llama3(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    # Wavelength-dependent scaling: high frequencies kept, low ones divided by ``factor``,
    # a smooth blend between (Llama 3.1's published rule).
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
    high_freq_factor = float(scaling.get("high_freq_factor", 4.0))
    old_context = float(scaling.get("original_max_position_embeddings", 8192))
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding:
    """Precomputed cos/sin tables; ``lookup(positions)`` once per step, shared by every layer."""

    def __init__(self, config: ModelConfig, max_positions: int, device: torch.device, dtype):
        inv_freq = inverse_frequencies(config)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(device=device, dtype=dtype)
        self.sin = emb.sin().to(device=device, dtype=dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [T, 1, head_dim], broadcast over heads."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim], HF's rotate-half layout."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def rotation_back(shift: int, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (float32, head_dim / 2 each) of the rotation ``shift`` positions back: dims
    d and d + head_dim / 2 become x1 cos + x2 sin and x2 cos - x1 sin."""
    freqs = shift * inv_freq
    return freqs.cos(), freqs.sin()


def rotated_back(keys: torch.Tensor, shift: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """Keys [T, heads, head_dim] rotated as if ``shift`` positions earlier (computed in float32,
    returned in the keys' dtype)."""
    cos, sin = rotation_back(shift, inv_freq)
    rotated = apply_rotary(keys.float(), torch.cat((cos, cos)), -torch.cat((sin, sin)))
    return rotated.to(keys.dtype)
