"""The paged-attention kernel (attention.c) for the torch model path: attention read in place
from the paged cache, for float32 or bfloat16 tensors, its units (a sequence's tile of queries)
spread over the kernels' thread pool. Without a C compiler the engine falls back to gathering
K/V and torch's SDPA: correct, slower on CPU, and not batch-invariant.
"""

from __future__ import annotations

import torch

from titan.kernels.library import ATTENTION_BF16, ATTENTION_F32, AttentionArgs, CpuKernels

_DTYPES = {torch.float32: ATTENTION_F32, torch.bfloat16: ATTENTION_BF16}


class CpuPagedAttention:
    def __init__(self, kernels: CpuKernels):
        self.kernels = kernels

    def supports(
        self, dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int
    ) -> bool:
        return (
            dtype in _DTYPES
            and block_size % 16 == 0
            and num_heads <= 128
            and num_heads % num_kv_heads == 0
            and head_dim <= 256
            and head_dim % 16 == 0
        )

    def __call__(
        self,
        q: torch.Tensor,  # [T, heads, head_dim], contiguous
        cache_k: torch.Tensor,  # [num_blocks, kv_heads, head_dim, block_size]
        cache_v: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
        block_tables: torch.Tensor,  # [S, max_blocks] int64
        query_starts: torch.Tensor,  # [S + 1] int64
        first_positions: torch.Tensor,  # [S] int64
        scale: float,
        dtype: int | None = None,  # library.ATTENTION_*; default: q's (caches of the same type)
        kv_codes: torch.Tensor | None = None,  # the int8 unit's codes of the caches (kv_codes.h)
    ) -> torch.Tensor:
        _, num_heads, head_dim = q.shape
        _, block_size, num_kv_heads, _ = cache_v.shape
        out = torch.empty_like(q)
        width = num_heads * head_dim
        args = AttentionArgs(
            q=q.data_ptr(),
            k_cache=cache_k.data_ptr(),
            v_cache=cache_v.data_ptr(),
            block_tables=block_tables.data_ptr(),
            query_starts=query_starts.data_ptr(),
            first_positions=first_positions.data_ptr(),
            out=out.data_ptr(),
            num_seqs=first_positions.shape[0],
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
            max_blocks=block_tables.shape[1],
            q_stride=width,
            out_stride=width,
            scale=scale,
            dtype=_DTYPES[q.dtype] if dtype is None else dtype,
            kv_codes=None if kv_codes is None else kv_codes.data_ptr(),
        )
        self.kernels.attention(args)
        return out

    def close(self) -> None:
        self.kernels.close()
