"""The Llama-family decoder on quantized weights, run by the CPU kernels (kernels/forward.c) in
one call per step: a GGUF file's own Q4_1/Q8_0 blocks, or float weights quantized to Q8_0.

Q and K, and gate and up, are fused along their rows at load (three GEMMs plus the output
projection per layer). Activations are float32; each one is quantized to int8 per block of 32
just before a matmul, as llama.cpp does; the KV cache is float16.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from titan.engine.model.config import ModelConfig
from titan.engine.model.rope import RotaryEmbedding
from titan.errors import ModelLoadError
from titan.kernels import packing
from titan.kernels.library import (
    ATTENTION_F32_F16_CACHE,
    ATTENTION_F32_F16_CACHE_REDUCED,
    KV_CODE_MAX_DIM,
    CpuKernels,
    KVMoveArgs,
    LayerWeights,
    Model,
    Step,
    kv_code_words,
    kv_codes_shape,
    pointer,
    qweight,
)

BLOCKS_FILE = Path("quantized") / "blocks.safetensors"
KV_DTYPE = torch.float16  # forward.c's cache type


@dataclass
class QuantizedLayer:
    input_norm: np.ndarray
    qkv: packing.PackedWeight
    qkv_bias: np.ndarray | None
    o_proj: packing.PackedWeight
    post_norm: np.ndarray
    gate_up: packing.PackedWeight
    down: packing.PackedWeight


@dataclass
class QuantizedWeights:
    layers: list[QuantizedLayer]
    final_norm: np.ndarray
    embedding: packing.PackedWeight
    lm_head: packing.PackedWeight

    def formats(self) -> str:
        """The formats of the layers' matmuls, e.g. "Q4_1" or "Q4_1, Q8_0"."""
        layer = self.layers[0]
        used = {w.format for w in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)}
        return ", ".join(packing.FORMAT_NAMES[f] for f in sorted(used))

    @property
    def num_bytes(self) -> int:
        arrays = [self.embedding.data, self.final_norm]
        if self.lm_head is not self.embedding:
            arrays.append(self.lm_head.data)
        for layer in self.layers:
            arrays += [layer.input_norm, layer.post_norm, layer.qkv.data, layer.o_proj.data]
            arrays += [layer.gate_up.data, layer.down.data]
        return sum(a.nbytes for a in arrays)


def can_quantize(config: ModelConfig) -> str | None:
    """Why the kernels cannot run this model's shapes, or None when they can."""
    widths = {
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "heads x head_dim": config.num_attention_heads * config.head_dim,
    }
    odd = [f"{name} {value}" for name, value in widths.items() if value % packing.QK]
    if odd:
        return f"{', '.join(odd)} not a multiple of {packing.QK}"
    if config.head_dim % 16 or config.head_dim > 256 or config.num_attention_heads > 128:
        return f"head_dim {config.head_dim} (the attention kernel takes multiples of 16 to 256)"
    return None


def load_quantized(hf_dir: Path, config: ModelConfig, *, use_file_blocks: bool) -> QuantizedWeights:
    """Weights for the kernels: the GGUF's own blocks (``use_file_blocks`` and a converted GGUF
    directory), else every matrix quantized to Q8_0 from the float weights."""
    from safetensors import safe_open

    blocks_path = hf_dir / BLOCKS_FILE
    float_files = sorted(hf_dir.glob("*.safetensors"))
    handles = [safe_open(str(f), framework="numpy") for f in float_files]
    index = {name: handle for handle in handles for name in handle.keys()}  # noqa: SIM118
    file_blocks = safe_open(str(blocks_path), framework="numpy") if use_file_blocks else None
    formats = (file_blocks.metadata() or {}) if file_blocks is not None else {}

    def floats(name: str) -> np.ndarray:
        if name not in index:
            raise ModelLoadError(f"weight {name!r} is missing from the checkpoint")
        return np.ascontiguousarray(index[name].get_tensor(name), dtype=np.float32)

    def blocks(name: str) -> tuple[int, np.ndarray]:
        if file_blocks is not None and name in formats:
            fmt = {v: k for k, v in packing.FORMAT_NAMES.items()}[formats[name]]
            return fmt, file_blocks.get_tensor(name)
        return packing.Q8_0, packing.quantize_q8_0(floats(name))

    def fused(*names: str) -> packing.PackedWeight:
        parts = [blocks(name) for name in names]
        fmts = {fmt for fmt, _ in parts}
        if len(fmts) > 1:  # mixed formats cannot share panels: requantize them alike
            parts = [(packing.Q8_0, packing.quantize_q8_0(floats(n))) for n in names]
        fmt = parts[0][0]
        return packing.pack_gguf(packing.concat_rows(*(raw for _, raw in parts)), fmt)

    layers = []
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        attn = prefix + "self_attn."
        bias = None
        if config.attention_bias:
            bias = np.concatenate([floats(f"{attn}{p}_proj.bias") for p in "qkv"])
        layers.append(
            QuantizedLayer(
                input_norm=floats(prefix + "input_layernorm.weight"),
                qkv=fused(*(f"{attn}{p}_proj.weight" for p in "qkv")),
                qkv_bias=bias,
                o_proj=fused(attn + "o_proj.weight"),
                post_norm=floats(prefix + "post_attention_layernorm.weight"),
                gate_up=fused(prefix + "mlp.gate_proj.weight", prefix + "mlp.up_proj.weight"),
                down=fused(prefix + "mlp.down_proj.weight"),
            )
        )
    embedding = fused("model.embed_tokens.weight")
    has_head = "lm_head.weight" in index and not config.tie_word_embeddings
    lm_head = fused("lm_head.weight") if has_head else embedding
    return QuantizedWeights(layers, floats("model.norm.weight"), embedding, lm_head)


class QuantizedLlama:
    """``step()`` runs a whole engine step in C; the KV cache is float16 tensors the runner
    owns (``bind_cache`` points the layers at them)."""

    def __init__(
        self,
        config: ModelConfig,
        weights: QuantizedWeights,
        kernels: CpuKernels,
        max_positions: int,
        block_size: int,
        reduced_attention: bool = False,
    ):
        self.config = config
        self.weights = weights
        self.kernels = kernels
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        rotary = RotaryEmbedding(config, max_positions, self.device, torch.float32)
        self._rope = (rotary.cos.numpy(), rotary.sin.numpy())
        self._layers = (LayerWeights * config.num_hidden_layers)()
        for slot, layer in zip(self._layers, weights.layers, strict=True):
            slot.input_norm = pointer(layer.input_norm)
            slot.qkv = qweight(layer.qkv, layer.qkv_bias)
            slot.o_proj = qweight(layer.o_proj)
            slot.post_norm = pointer(layer.post_norm)
            slot.gate_up = qweight(layer.gate_up)
            slot.down = qweight(layer.down)
        self._model = Model(
            hidden=config.hidden_size,
            intermediate=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            block_size=block_size,
            vocab=weights.lm_head.rows,
            eps=config.rms_norm_eps,
            layers=ctypes.addressof(self._layers),
            final_norm=pointer(weights.final_norm),
            lm_head=qweight(weights.lm_head),
            embedding=qweight(weights.embedding),
            rope_cos=pointer(self._rope[0]),
            rope_sin=pointer(self._rope[1]),
            attention_dtype=(
                ATTENTION_F32_F16_CACHE_REDUCED if reduced_attention else ATTENTION_F32_F16_CACHE
            ),
        )
        self._caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        # The int8 unit's codes of each layer's keys and values (kv_codes.h), kept beside the
        # cache: it reads them instead of rounding every key and value again at each tile and
        # decode step.
        self.uses_kv_codes = (
            reduced_attention and kernels.reads_kv_codes and config.head_dim <= KV_CODE_MAX_DIM
        )
        self._kv_codes: list[torch.Tensor] = []
        # Seconds the kernels spent in matmuls, attention and the rest, since the model loaded.
        self.kernel_seconds = np.zeros(3, dtype=np.float64)

    @property
    def num_parameters(self) -> int:
        c = self.config
        per_layer = (
            (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim * c.hidden_size
            + c.num_attention_heads * c.head_dim * c.hidden_size
            + 3 * c.intermediate_size * c.hidden_size
        )
        head = 0 if self.weights.lm_head is self.weights.embedding else c.vocab_size
        return c.num_hidden_layers * per_layer + (c.vocab_size + head) * c.hidden_size

    @property
    def kv_code_bytes(self) -> int:
        """Bytes of KV codes per token, KV head and layer, beside its KV (0: none)."""
        return 4 * kv_code_words(self.config.head_dim) if self.uses_kv_codes else 0

    def bind_cache(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Points the layers at the runner's caches; the KV codes are this model's own, as many
        blocks as the caches (left unwritten, like them, until a key is)."""
        for slot, (k, v) in zip(self._layers, kv_caches, strict=True):
            if k.dtype != KV_DTYPE or not (k.is_contiguous() and v.is_contiguous()):
                raise ValueError("the quantized model needs contiguous float16 KV caches")
            slot.k_cache, slot.v_cache = k.data_ptr(), v.data_ptr()
        self._caches = kv_caches  # keeps them alive while C holds their addresses
        if self.uses_kv_codes:
            shape = kv_codes_shape(*kv_caches[0][0].shape)
            self._kv_codes = [torch.empty(shape, dtype=torch.int32) for _ in kv_caches]
            for slot, codes in zip(self._layers, self._kv_codes, strict=True):
                slot.kv_codes = codes.data_ptr()
        pointers = ctypes.c_void_p * len(kv_caches)
        self._cache_pointers = (
            pointers(*(k.data_ptr() for k, _ in kv_caches)),
            pointers(*(v.data_ptr() for _, v in kv_caches)),
            pointers(*(codes.data_ptr() for codes in self._kv_codes)),
        )

    @property
    def kv_codes(self) -> list[torch.Tensor]:
        """Each layer's KV codes (empty without them)."""
        return self._kv_codes

    def copy_kv_codes(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write's block copies, for the codes (the runner copies the KV)."""
        for source, destination in copies:
            for codes in self._kv_codes:
                codes[destination].copy_(codes[source])

    def move_kv(
        self,
        source: Sequence[int],
        destination: Sequence[int],
        rotation: tuple[np.ndarray, np.ndarray] | None,
    ) -> None:
        """Every layer's KV from slots ``source`` to ``destination`` (kv_move.c); keys rotated
        by ``rotation`` (float32 cos and sin of head_dim / 2 frequencies) or copied as they are."""
        sources, destinations = np.asarray(source, np.int64), np.asarray(destination, np.int64)
        cos, sin = (None, None) if rotation is None else rotation
        args = KVMoveArgs(
            k_caches=ctypes.addressof(self._cache_pointers[0]),
            v_caches=ctypes.addressof(self._cache_pointers[1]),
            source_slots=pointer(sources),
            destination_slots=pointer(destinations),
            num_layers=len(self._caches),
            num_tokens=len(sources),
            num_kv_heads=self.config.num_key_value_heads,
            head_dim=self.config.head_dim,
            block_size=self._model.block_size,
            cos=pointer(cos),
            sin=pointer(sin),
            kv_codes=ctypes.addressof(self._cache_pointers[2]) if self._kv_codes else None,
        )
        self.kernels.kv_move(args)

    def step(
        self,
        token_ids: list[int],
        positions: list[int],
        slots: list[int],
        block_tables: list[list[int]],
        query_starts: list[int],
        first_positions: list[int],
        logit_rows: list[int],
    ) -> torch.Tensor:
        """One step's tokens through the model; logits ``[len(logit_rows), vocab]``."""
        arrays = [
            np.asarray(values, dtype=np.int64)
            for values in (token_ids, positions, slots, query_starts, first_positions, logit_rows)
        ]
        tokens, positions_a, slots_a, starts, firsts, rows = arrays
        width = max(len(table) for table in block_tables)
        tables = np.zeros((len(block_tables), width), dtype=np.int64)
        for i, table in enumerate(block_tables):
            tables[i, : len(table)] = table
        logits = np.empty((len(logit_rows), self._model.vocab), dtype=np.float32)
        step = Step(
            num_tokens=len(tokens),
            token_ids=pointer(tokens),
            positions=pointer(positions_a),
            slot_mapping=pointer(slots_a),
            num_seqs=len(block_tables),
            max_blocks=width,
            block_tables=pointer(tables),
            query_starts=pointer(starts),
            first_positions=pointer(firsts),
            num_logits=len(logit_rows),
            logit_rows=pointer(rows),
            logits=pointer(logits),
            seconds=pointer(self.kernel_seconds),
        )
        self.kernels.forward(self._model, step)
        return torch.from_numpy(logits)
