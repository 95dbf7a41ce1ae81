"""Quantized weights in the panel layout of the C kernels (quant.c explains it), from GGUF's own
Q4_1 and Q8_0 blocks or from float weights (quantized to Q8_0 here).

A weight is ``[rows, cols]`` (output features by input features) as in ``F.linear``; ``cols``
must be a multiple of 32. Rows are padded to a multiple of 16 with zero blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QK = 32
PANEL = 16
Q4_1 = 1  # enum weight_format in cpu.h
Q8_0 = 2
FORMAT_NAMES = {Q4_1: "Q4_1", Q8_0: "Q8_0"}
BLOCK_BYTES = {Q4_1: 20, Q8_0: 34}  # GGUF's block sizes
PANEL_BLOCK_BYTES = {Q4_1: 320, Q8_0: 608}


@dataclass(frozen=True)
class PackedWeight:
    format: int
    rows: int
    cols: int
    data: np.ndarray  # uint8 [panels, cols / 32, PANEL_BLOCK_BYTES[format]]


def gguf_blocks(raw: np.ndarray, fmt: int, rows: int, cols: int) -> np.ndarray:
    """GGUF's bytes of a ``[rows, cols]`` tensor as ``[rows, cols / 32, block bytes]``."""
    return np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, cols // QK, BLOCK_BYTES[fmt])


def concat_rows(*blocks: np.ndarray) -> np.ndarray:
    """Several weights' GGUF blocks stacked along rows (Q, K and V into one QKV)."""
    return np.concatenate(blocks, axis=0)


def permute_rows(blocks: np.ndarray, order: np.ndarray) -> np.ndarray:
    return blocks[order]


def pack_gguf(blocks: np.ndarray, fmt: int) -> PackedWeight:
    """``[rows, nb, block bytes]`` GGUF blocks of one format into panels."""
    rows, nb, _ = blocks.shape
    padded = _pad_rows(blocks, rows)
    panels = padded.shape[0] // PANEL
    scale = padded[:, :, 0:2].copy().view(np.uint16).reshape(panels, PANEL, nb)
    scale = scale.transpose(0, 2, 1)  # [panels, nb, 16]
    if fmt == Q4_1:
        minimum = padded[:, :, 2:4].copy().view(np.uint16).reshape(panels, PANEL, nb)
        minimum = minimum.transpose(0, 2, 1)
        # qs[j] already holds q[j] | q[j + 16] << 4: group s takes bytes 4s..4s+3 of each row.
        qs = padded[:, :, 4:20].reshape(panels, PANEL, nb, 4, 4).transpose(0, 2, 3, 1, 4)
        parts = [qs.reshape(panels, nb, 256), _bytes(scale), _bytes(minimum)]
    elif fmt == Q8_0:
        values = padded[:, :, 2:34].view(np.int8)
        qs = values.reshape(panels, PANEL, nb, 8, 4).transpose(0, 2, 3, 1, 4)
        sums = values.sum(-1, dtype=np.int32).reshape(panels, PANEL, nb).transpose(0, 2, 1)
        parts = [qs.reshape(panels, nb, 512).view(np.uint8), _bytes(scale), _bytes(sums)]
    else:
        raise ValueError(f"unsupported block format {fmt}")
    data = np.ascontiguousarray(np.concatenate([np.ascontiguousarray(p) for p in parts], axis=-1))
    if data.shape != (panels, nb, PANEL_BLOCK_BYTES[fmt]):
        raise AssertionError(f"packed {data.shape}, expected {PANEL_BLOCK_BYTES[fmt]} per block")
    return PackedWeight(fmt, rows, nb * QK, data)


def quantize_q8_0(weights: np.ndarray) -> np.ndarray:
    """Float ``[rows, cols]`` to GGUF Q8_0 blocks ``[rows, cols / 32, 34]`` as llama.cpp makes
    them: d = max|w| / 127 (stored as float16), q = round(w / d)."""
    rows, cols = weights.shape
    if cols % QK:
        raise ValueError(f"{cols} input features: not a multiple of {QK}")
    values = np.asarray(weights, dtype=np.float32).reshape(rows, cols // QK, QK)
    scale = np.abs(values).max(-1) / 127.0
    inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)
    quantized = np.rint(values * inverse[..., None]).clip(-127, 127).astype(np.int8)
    blocks = np.empty((rows, cols // QK, 34), dtype=np.uint8)
    blocks[:, :, 0:2] = scale.astype(np.float16).reshape(rows, cols // QK, 1).view(np.uint8)
    blocks[:, :, 2:] = quantized.view(np.uint8)
    return blocks


def dequantize(blocks: np.ndarray, fmt: int) -> np.ndarray:
    """GGUF blocks back to float32 ``[rows, cols]``: what the float path runs."""
    rows, nb, _ = blocks.shape
    d = blocks[:, :, 0:2].copy().view(np.float16).astype(np.float32)
    if fmt == Q8_0:
        q = blocks[:, :, 2:34].view(np.int8).astype(np.float32)
        return (d * q).reshape(rows, nb * QK)
    m = blocks[:, :, 2:4].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, :, 4:20]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float32)
    return (d * q + m).reshape(rows, nb * QK)


def _pad_rows(blocks: np.ndarray, rows: int) -> np.ndarray:
    missing = -rows % PANEL
    if not missing:
        return blocks
    pad = np.zeros((missing, *blocks.shape[1:]), dtype=blocks.dtype)
    return np.concatenate([blocks, pad], axis=0)


def _bytes(values: np.ndarray) -> np.ndarray:
    panels, nb, _ = values.shape
    return np.ascontiguousarray(values).view(np.uint8).reshape(panels, nb, -1)
