"""Logits at every position of one sequence, computed by an engine's own model and KV cache in
one prefill: what teacher-forced perplexity and the attention comparison read."""

from __future__ import annotations

from typing import Any

import torch


def all_logits(engine: Any, token_ids: list[int]) -> torch.Tensor:
    """Logits at every position of one sequence, computed as one prefill by the engine's own
    model and KV cache (blocks 0..n written directly: only on an engine that has not run
    anything yet, whose prefix cache holds nothing those blocks could be serving)."""
    from titan.engine.model.attention import AttentionMetadata, KernelBatch
    from titan.engine.model.quantized import QuantizedLlama

    runner = engine.runner
    size = runner.block_size
    blocks = list(range(-(-len(token_ids) // size)))
    positions = list(range(len(token_ids)))
    slots = positions  # blocks 0, 1, ... in order
    model = runner.model
    if isinstance(model, QuantizedLlama):
        return model.step(token_ids, positions, slots, [blocks], [0, len(token_ids)], [0],
                          positions).clone()  # fmt: skip
    slot_mapping = torch.tensor(slots)
    meta = AttentionMetadata(slot_mapping, slot_mapping // size, slot_mapping % size)
    meta.kernel_batch = KernelBatch(
        runner.attention_kernel, torch.tensor([blocks]), torch.tensor([0, len(token_ids)]),
        torch.tensor([0]),
    )  # fmt: skip
    with torch.inference_mode():
        hidden = model.forward(torch.tensor(token_ids), torch.tensor(positions), meta,
                               runner.kv_caches)  # fmt: skip
        return model.compute_logits(hidden)
