"""The model runner: one forward pass per step over the scheduled decodes and prefill chunks."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from titan.engine.kv_cache.context_shift import KVMove
from titan.engine.model.attention import (
    AttentionMetadata,
    DecodeGroup,
    KernelBatch,
    PagedAttentionKernel,
    PrefillChunk,
    kv_cache_shapes,
)
from titan.engine.model.llama import LlamaForCausalLM
from titan.engine.model.quantized import QuantizedLlama
from titan.engine.model.rope import inverse_frequencies, rotated_back, rotation_back
from titan.engine.sampler import SampledToken, SamplingRow, sample
from titan.engine.scheduler import ScheduledRequest

log = logging.getLogger(__name__)

# A decode group is padded to its longest context; a new group starts when padding would add
# more than this fraction of the group's real context (fewer bytes gathered, more kernel calls).
_MAX_PADDING_FRACTION = 0.25


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    kv_code_bytes: int = 0  # the int8 unit's KV codes per token, KV head and layer (0: none)

    @property
    def bytes_per_block(self) -> int:
        element = torch.empty((), dtype=self.dtype).element_size()
        per_head = 2 * self.head_dim * element + self.kv_code_bytes
        return self.num_layers * self.block_size * self.num_kv_heads * per_head


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM | QuantizedLlama,
        spec: KVCacheSpec,
        num_blocks: int,
        attention_kernel: PagedAttentionKernel | None = None,
    ):
        self.model = model
        self.attention_kernel = attention_kernel
        self.spec = spec
        self.block_size = spec.block_size
        self.device = model.device
        self.group_size = model.config.num_queries_per_kv
        k_shape, v_shape = kv_cache_shapes(
            num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim
        )
        # The C kernels read no cache slot before it is written (scores past a sequence's length
        # are replaced before the softmax, values past it never summed): their cache is left
        # unwritten, so memory is only resident once used. Torch's SDPA multiplies masked
        # positions' values by zero, so its cache must hold no NaN: zeros.
        uses_kernels = attention_kernel is not None or isinstance(model, QuantizedLlama)
        allocate = torch.empty if uses_kernels else torch.zeros
        self.kv_caches = [
            (
                allocate(k_shape, dtype=spec.dtype, device=self.device),
                allocate(v_shape, dtype=spec.dtype, device=self.device),
            )
            for _ in range(spec.num_layers)
        ]
        if isinstance(model, QuantizedLlama):
            model.bind_cache(self.kv_caches)

    @torch.inference_mode()
    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write of forked sequences, in order, before the forward pass writes."""
        for source, destination in copies:
            for key_cache, value_cache in self.kv_caches:
                key_cache[destination].copy_(key_cache[source])
                value_cache[destination].copy_(value_cache[source])
        if isinstance(self.model, QuantizedLlama):
            self.model.copy_kv_codes(copies)

    @torch.inference_mode()
    def move_kv(self, moves: list[KVMove]) -> None:
        """Copy KV between slots, every layer; keys rotated back by each move's shift (RoPE is a
        rotation per position, so the key at ``q + d`` rotated by ``-d`` is the key at ``q``)."""
        size, device = self.block_size, self.device
        inv_freq = inverse_frequencies(self.model.config).to(device)
        if isinstance(self.model, QuantizedLlama):  # one pass in C (kv_move.c)
            for move in moves:
                rotation = None
                if move.shift:
                    rotation = tuple(x.numpy() for x in rotation_back(move.shift, inv_freq))
                self.model.move_kv(move.source_slots, move.destination_slots, rotation)
            return
        for move in moves:
            source = torch.tensor(move.source_slots, dtype=torch.long, device=device)
            destination = torch.tensor(move.destination_slots, dtype=torch.long, device=device)
            for key_cache, value_cache in self.kv_caches:
                keys = key_cache[source // size, :, :, source % size]  # [n, kv_heads, head_dim]
                if move.shift:
                    keys = rotated_back(keys, move.shift, inv_freq)
                key_cache[destination // size, :, :, destination % size] = keys
                values = value_cache.view(-1, *value_cache.shape[2:])
                values.index_copy_(0, destination, values.index_select(0, source))

    @torch.inference_mode()
    def execute(
        self, scheduled: list[ScheduledRequest], rows: dict[str, SamplingRow]
    ) -> dict[str, SampledToken]:
        """Run the step; sample for the requests in ``rows`` (those whose step ends their known
        tokens). Returns request id -> sampled token."""
        decodes = sorted(
            (s for s in scheduled if s.num_new_tokens == 1), key=lambda s: s.start, reverse=True
        )
        prefills = [s for s in scheduled if s.num_new_tokens > 1]
        ordered = decodes + prefills

        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last_index: dict[str, int] = {}
        for item in ordered:
            request = item.request
            end = item.start + item.num_new_tokens
            input_ids.extend(request.all_token_ids[item.start : end])
            positions.extend(range(item.start, end))
            block_ids = request.block_ids
            size = self.block_size
            slots.extend(block_ids[p // size] * size + p % size for p in range(item.start, end))
            last_index[request.request_id] = len(input_ids) - 1
        sampling_ids = [
            item.request.request_id for item in ordered if item.request.request_id in rows
        ]
        logit_rows = [last_index[r] for r in sampling_ids]
        if isinstance(self.model, QuantizedLlama):  # the whole step in one call to the kernels
            logits = self.model.step(
                input_ids,
                positions,
                slots,
                self._block_tables(ordered),
                self._query_starts(ordered),
                [item.start for item in ordered],
                logit_rows,
            )
        else:
            logits = self._torch_logits(decodes, prefills, input_ids, positions, slots, logit_rows)
        if not sampling_ids:
            return {}
        sampled = sample(logits, [rows[r] for r in sampling_ids])
        return dict(zip(sampling_ids, sampled, strict=True))

    def _torch_logits(
        self,
        decodes: list[ScheduledRequest],
        prefills: list[ScheduledRequest],
        input_ids: list[int],
        positions: list[int],
        slots: list[int],
        logit_rows: list[int],
    ) -> torch.Tensor:
        device = self.device
        slot_mapping = torch.tensor(slots, dtype=torch.long, device=device)
        meta = AttentionMetadata(
            slot_mapping=slot_mapping,
            slot_blocks=slot_mapping // self.block_size,
            slot_offsets=slot_mapping % self.block_size,
        )
        if self.attention_kernel is not None:
            meta.kernel_batch = self._kernel_batch(decodes + prefills)
        else:
            meta.decode_groups = self._decode_groups(decodes)
            meta.prefills = self._prefill_chunks(prefills, first_token=len(decodes))
        hidden = self.model.forward(  # type: ignore[union-attr]
            torch.tensor(input_ids, dtype=torch.long, device=device),
            torch.tensor(positions, dtype=torch.long, device=device),
            meta,
            self.kv_caches,
        )
        index = torch.tensor(logit_rows, dtype=torch.long, device=device)
        return self.model.compute_logits(hidden.index_select(0, index)).cpu()  # type: ignore[union-attr]

    def _block_tables(self, ordered: list[ScheduledRequest]) -> list[list[int]]:
        """Each sequence's blocks up to the end of this step's tokens."""
        return [
            item.request.block_ids[: -(-(item.start + item.num_new_tokens) // self.block_size)]
            for item in ordered
        ]

    @staticmethod
    def _query_starts(ordered: list[ScheduledRequest]) -> list[int]:
        starts = [0]
        for item in ordered:
            starts.append(starts[-1] + item.num_new_tokens)
        return starts

    def _kernel_batch(self, ordered: list[ScheduledRequest]) -> KernelBatch:
        tables = self._block_tables(ordered)
        width = max(len(t) for t in tables)
        return KernelBatch(
            kernel=self.attention_kernel,
            block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
            query_starts=torch.tensor(self._query_starts(ordered)),
            first_positions=torch.tensor([item.start for item in ordered]),
        )

    def _decode_groups(self, decodes: list[ScheduledRequest]) -> list[DecodeGroup]:
        """``decodes`` sorted by context length, longest first, split to bound padding."""
        groups: list[list[ScheduledRequest]] = []
        for item in decodes:
            if groups:
                group = groups[-1]
                longest = group[0].start + 1
                real = sum(g.start + 1 for g in group) + item.start + 1
                if longest * (len(group) + 1) <= real * (1 + _MAX_PADDING_FRACTION):
                    group.append(item)
                    continue
            groups.append([item])

        result = []
        first = 0
        for group in groups:
            context_lens = [g.start + 1 for g in group]
            num_blocks = -(-context_lens[0] // self.block_size)
            table = [g.request.block_ids[:num_blocks] for g in group]
            table = [ids + [0] * (num_blocks - len(ids)) for ids in table]
            padded = num_blocks * self.block_size
            lens = torch.tensor(context_lens, device=self.device).unsqueeze(1)
            mask = torch.arange(padded, device=self.device).unsqueeze(0) < lens
            result.append(
                DecodeGroup(
                    start_token=first,
                    num_seqs=len(group),
                    block_tables=torch.tensor(table, dtype=torch.long, device=self.device),
                    mask=mask.view(len(group), 1, 1, padded),
                )
            )
            first += len(group)
        return result

    def _prefill_chunks(
        self, prefills: list[ScheduledRequest], first_token: int
    ) -> list[PrefillChunk]:
        chunks = []
        for item in prefills:
            n = item.num_new_tokens
            context_len = item.start + n
            num_blocks = -(-context_len // self.block_size)
            query_pos = torch.arange(item.start, context_len, device=self.device).unsqueeze(1)
            key_pos = torch.arange(context_len, device=self.device).unsqueeze(0)
            mask = (key_pos <= query_pos).repeat(self.group_size, 1)
            chunks.append(
                PrefillChunk(
                    start_token=first_token,
                    num_tokens=n,
                    block_ids=torch.tensor(
                        item.request.block_ids[:num_blocks], dtype=torch.long, device=self.device
                    ),
                    context_len=context_len,
                    mask=mask,
                )
            )
            first_token += n
        return chunks
