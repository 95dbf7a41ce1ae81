"""Attention over the paged KV cache, for a step that mixes decodes and prefill chunks.

The step's tokens are laid out decodes first (one token per sequence), then each prefill chunk.
New K/V for every token are written into the cache *before* any attention runs in a layer, so a
chunk attends to its own earlier chunks, to prefix-cache hits, and to itself, all from the cache.

Cache layouts, per layer: K blocks are stored transposed, ``[num_blocks, kv_heads, head_dim,
block_size]``, so the scores of a block's tokens are a run of vector FMAs over head_dim with the
tokens in the vector lanes (the CPU kernel's inner loop); V blocks are
``[num_blocks, block_size, kv_heads, head_dim]``.

Grouped-query attention without copying K/V per query head: the query heads that share a KV head
are folded into the query-length dimension, so one KV head serves ``G`` times more queries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F


@dataclass
class PrefillChunk:
    start_token: int  # index of the chunk's first token in the step's flat token list
    num_tokens: int
    block_ids: torch.Tensor  # [num_blocks] the sequence's blocks covering ``context_len``
    context_len: int  # tokens of this sequence in the cache after this step
    mask: torch.Tensor  # [G * num_tokens, context_len] bool, True = may attend


@dataclass
class DecodeGroup:
    """Decodes of similar context length, padded to the longest of the group."""

    start_token: int
    num_seqs: int
    block_tables: torch.Tensor  # [num_seqs, max_blocks]
    mask: torch.Tensor  # [num_seqs, 1, 1, padded_len] bool


class PagedAttentionKernel(Protocol):
    """Attention for every query token read in place from the paged cache (the C kernel)."""

    def __call__(
        self,
        q: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        block_tables: torch.Tensor,
        query_starts: torch.Tensor,
        first_positions: torch.Tensor,
        scale: float,
    ) -> torch.Tensor: ...


@dataclass
class KernelBatch:
    """The whole step for a PagedAttentionKernel: sequence s owns query tokens
    [query_starts[s], query_starts[s + 1]), the first at position first_positions[s]."""

    kernel: PagedAttentionKernel
    block_tables: torch.Tensor  # [S, max_blocks]
    query_starts: torch.Tensor  # [S + 1]
    first_positions: torch.Tensor  # [S]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] flat cache slot of each new token
    slot_blocks: torch.Tensor  # [T] slot_mapping // block_size
    slot_offsets: torch.Tensor  # [T] slot_mapping % block_size
    # With a kernel, it computes every token; otherwise padded decode groups and prefill chunks
    # go through torch's SDPA (CUDA, or a CPU without a C compiler).
    kernel_batch: KernelBatch | None = None
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)


def kv_cache_shapes(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (num_blocks, num_kv_heads, head_dim, block_size), (
        num_blocks,
        block_size,
        num_kv_heads,
        head_dim,
    )


def write_kv(
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: AttentionMetadata,
) -> None:
    """k, v: [T, kv_heads, head_dim] into their slots."""
    cache_k[meta.slot_blocks, :, :, meta.slot_offsets] = k
    cache_v.view(-1, *cache_v.shape[2:]).index_copy_(0, meta.slot_mapping, v)


def paged_attention(
    q: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    meta: AttentionMetadata,
    num_kv_heads: int,
    scale: float,
) -> torch.Tensor:
    """q: [T, heads, head_dim] -> [T, heads * head_dim]."""
    num_tokens, num_heads, head_dim = q.shape
    group = num_heads // num_kv_heads
    out = torch.empty(num_tokens, num_heads * head_dim, dtype=q.dtype, device=q.device)

    if meta.kernel_batch is not None:
        batch = meta.kernel_batch
        attn = batch.kernel(
            q.contiguous(),
            cache_k,
            cache_v,
            batch.block_tables,
            batch.query_starts,
            batch.first_positions,
            scale,
        )
        return attn.view(num_tokens, num_heads * head_dim)

    for decode in meta.decode_groups:
        rows = slice(decode.start_token, decode.start_token + decode.num_seqs)
        # [B, kv_heads, G, D]: the G query heads of a KV head as G "query positions".
        q_dec = q[rows].view(decode.num_seqs, num_kv_heads, group, head_dim)
        k_dec = _gather_k(cache_k, decode.block_tables)
        v_dec = _gather_v(cache_v, decode.block_tables)
        attn = F.scaled_dot_product_attention(
            q_dec, k_dec, v_dec, attn_mask=decode.mask, scale=scale
        )
        out[rows] = attn.reshape(decode.num_seqs, num_heads * head_dim)

    for chunk in meta.prefills:
        rows = slice(chunk.start_token, chunk.start_token + chunk.num_tokens)
        n = chunk.num_tokens
        # [kv_heads, G * n, D], row g * n + i is query head (kv, g) at chunk position i.
        q_pre = q[rows].view(n, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        q_pre = q_pre.reshape(1, num_kv_heads, group * n, head_dim)
        k_pre = _gather_k(cache_k, chunk.block_ids.unsqueeze(0))[:, :, : chunk.context_len]
        v_pre = _gather_v(cache_v, chunk.block_ids.unsqueeze(0))[:, :, : chunk.context_len]
        attn = F.scaled_dot_product_attention(
            q_pre, k_pre, v_pre, attn_mask=chunk.mask, scale=scale
        )
        attn = attn.view(num_kv_heads, group, n, head_dim).permute(2, 0, 1, 3)
        out[rows] = attn.reshape(n, num_heads * head_dim)
    return out


def _gather_k(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[B, max_blocks] block ids -> [B, kv_heads, max_blocks * block_size, head_dim]."""
    num_seqs, max_blocks = block_tables.shape
    _, num_kv_heads, head_dim, block_size = cache.shape
    gathered = cache.index_select(0, block_tables.reshape(-1))
    gathered = gathered.view(num_seqs, max_blocks, num_kv_heads, head_dim, block_size)
    return gathered.permute(0, 2, 1, 4, 3).reshape(num_seqs, num_kv_heads, -1, head_dim)


def _gather_v(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[B, max_blocks] block ids -> [B, kv_heads, max_blocks * block_size, head_dim]."""
    num_seqs, max_blocks = block_tables.shape
    _, block_size, num_kv_heads, head_dim = cache.shape
    gathered = cache.index_select(0, block_tables.reshape(-1))
    gathered = gathered.view(num_seqs, max_blocks * block_size, num_kv_heads, head_dim)
    return gathered.transpose(1, 2)
