"""all-MiniLM-L6-v2 on Titan's CPU kernels: the sentence-transformers pipeline (BERT, mean
pooling over the tokens, unit length) with every linear layer's weights in Q8_0 blocks and its
input quantized to int8 per block of 32, as the engine's quantized path does.

Why: a lookup embeds one short question, and the float32 model then streams its 42 MB of
weights for ~12 tokens (8.5 of torch's 14 ms went to the linear layers on a 2-core EPYC). Q8_0
weights are a quarter of that, and the int8 dot products are the kernels' own. The whole
forward is one C call (kernels/bert.c): the ~15 torch operations a layer between the GEMMs
cost about as much as the GEMMs on a question's few tokens. The vectors stay within cosine
0.999 of the float32 model's, 0.9997 on average (tests/cache/test_minilm.py).
"""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from titan.kernels.library import BertBatch, BertLayer, BertModel, CpuKernels, pointer, qweight
from titan.kernels.packing import Q8_0, PackedWeight, pack_gguf, quantize_q8_0

Vector = tuple[float, ...]
Rows = list[list[int]]  # per text: its token ids, or their segment types
# Rows per forward: a RAG file's hundreds of 256-token chunks in one would hold gigabytes of
# activations (the FFN's are 1,536 floats a token).
MAX_TOKENS = 2048
MEAN_UNIT, FIRST_STATE = 0, 1  # bert.c's outputs: pooled unit vectors, or [CLS] states


@dataclass(frozen=True)
class _Linear:
    weight: PackedWeight
    bias: np.ndarray  # float32 [rows]

    def view(self) -> Any:
        return qweight(self.weight, self.bias)


class QuantizedMiniLM:
    """``encode`` as sentence-transformers' for this model's directory (BERT + mean pooling +
    normalize); ``load`` refuses another pipeline with ValueError."""

    def __init__(self, kernels: CpuKernels, tokenizers: tuple[Any, Any], arrays: list[Any],
                 model: BertModel):  # fmt: skip
        self._kernels = kernels
        self._tokenizer, self._whole = tokenizers
        self._arrays = arrays  # what the C structure points into: kept alive with it
        self._model = model
        self._hidden = int(model.hidden)
        self.isa = kernels.isa

    @classmethod
    def load(
        cls, directory: Path, kernels: CpuKernels, weights: dict[str, Any] | None = None
    ) -> QuantizedMiniLM:
        """The model of ``directory``; with ``weights`` (safetensors' arrays by name), the same
        architecture with those weights (the pair verifier's fine-tuned copy)."""
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        _check_pipeline(directory)
        config = json.loads((directory / "config.json").read_text())
        if config.get("model_type") != "bert" or config.get("hidden_act") != "gelu":
            raise ValueError(f"not a BERT model with GELU: {directory}")
        if weights is None:
            weights = load_file(str(directory / "model.safetensors"))
        weights = {name.removeprefix("bert."): array for name, array in weights.items()}
        settings = json.loads((directory / "sentence_bert_config.json").read_text())
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        tokenizer.no_padding()
        whole = Tokenizer.from_file(str(directory / "tokenizer.json"))  # for token_offsets
        whole.no_padding()
        whole.no_truncation()
        tokenizer.enable_truncation(int(settings.get("max_seq_length", 256)))
        arrays, model = _bert_model(weights, config)
        return cls(kernels, (tokenizer, whole), arrays, model)

    @property
    def kernels(self) -> CpuKernels:
        return self._kernels

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """Each token's character span in ``text``, no special tokens, not truncated."""
        encoded = self._whole.encode(text, add_special_tokens=False)
        return [(int(start), int(end)) for start, end in encoded.offsets]

    def encode(self, texts: list[str]) -> list[Vector]:
        """Unit vectors of ``texts``, computed together: the matmuls take every text's tokens
        at once (the weights are read once for the batch), attention and pooling go text by
        text. Every operation is per row or per text, so a text's vector is the same bits
        whatever else is in the batch."""
        ids = [self._tokenizer.encode(text).ids for text in texts]
        types = [[0] * len(one) for one in ids]
        return [tuple(row.tolist()) for row in self._outputs(ids, types, MEAN_UNIT)]

    def pair_states(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """The [CLS] state of each pair of texts read together ([CLS] a [SEP] b [SEP], the
        second text's tokens of type 1), as a cross-encoder reads them: [pairs, hidden]."""
        encodings = [self._tokenizer.encode(first, second) for first, second in pairs]
        ids = [encoding.ids for encoding in encodings]
        types = [encoding.type_ids for encoding in encodings]
        return self._outputs(ids, types, FIRST_STATE)

    def _outputs(self, ids: Rows, types: Rows, output: int) -> np.ndarray:
        """bert.c's ``output`` of each text, in forwards of at most MAX_TOKENS rows (one long
        text alone)."""
        out = np.empty((len(ids), self._hidden), dtype=np.float32)
        start = 0
        while start < len(ids):
            end, rows = start, 0
            while end < len(ids) and (end == start or rows + len(ids[end]) <= MAX_TOKENS):
                rows += len(ids[end])
                end += 1
            self._forward(ids[start:end], types[start:end], output, out[start:end])
            start = end
        return out

    def _forward(self, ids: Rows, types: Rows, output: int, out: np.ndarray) -> None:
        starts = np.cumsum([0, *(len(one) for one in ids)], dtype=np.int64)
        token_ids = np.fromiter((i for one in ids for i in one), np.int64, int(starts[-1]))
        type_ids = np.fromiter((i for one in types for i in one), np.int64, int(starts[-1]))
        batch = BertBatch(len(ids), pointer(starts), pointer(token_ids), pointer(type_ids),
                          output, pointer(out))  # fmt: skip
        self._kernels.bert_forward(self._model, batch)


def _check_pipeline(directory: Path) -> None:
    """sentence-transformers' modules for this directory: Transformer, mean Pooling, Normalize."""
    modules = json.loads((directory / "modules.json").read_text())
    kinds = [module["type"].rsplit(".", 1)[-1] for module in modules]
    if kinds != ["Transformer", "Pooling", "Normalize"]:
        raise ValueError(f"unexpected sentence-transformers modules {kinds} in {directory}")
    pooling_dir = next(module["path"] for module in modules if module["type"].endswith("Pooling"))
    pooling = json.loads((directory / pooling_dir / "config.json").read_text())
    chosen = [key for key, value in pooling.items() if key.startswith("pooling_mode") and value]
    if chosen != ["pooling_mode_mean_tokens"]:
        raise ValueError(f"unexpected pooling {chosen} in {directory}")


def _quantized(weights: dict[str, Any], *names: str) -> _Linear:
    """The named linear layers stacked along their outputs (Q, K and V into one)."""
    matrix = np.concatenate([weights[f"{name}.weight"] for name in names]).astype(np.float32)
    bias = np.concatenate([weights[f"{name}.bias"] for name in names]).astype(np.float32)
    if matrix.shape[1] % 32:
        raise ValueError(f"{names[0]}: {matrix.shape[1]} inputs, not a multiple of 32")
    return _Linear(pack_gguf(quantize_q8_0(matrix), Q8_0), np.ascontiguousarray(bias))


def _float(weights: dict[str, Any], name: str) -> np.ndarray:
    return np.ascontiguousarray(weights[name], dtype=np.float32)


def _bert_model(weights: dict[str, Any], config: dict[str, Any]) -> tuple[list[Any], BertModel]:
    """bert.c's view of the weights, and the arrays it points into."""
    arrays: list[Any] = []

    def kept(array: Any) -> Any:
        arrays.append(array)
        return array

    def floats(name: str) -> int | None:
        return pointer(kept(_float(weights, name)))

    layers = (BertLayer * int(config["num_hidden_layers"]))()
    for index, layer in enumerate(layers):
        prefix = f"encoder.layer.{index}."
        attention = prefix + "attention."
        parts = (f"{attention}self.{part}" for part in ("query", "key", "value"))
        layer.qkv = kept(_quantized(weights, *parts)).view()
        layer.out = kept(_quantized(weights, f"{attention}output.dense")).view()
        layer.norm1_weight = floats(f"{attention}output.LayerNorm.weight")
        layer.norm1_bias = floats(f"{attention}output.LayerNorm.bias")
        layer.up = kept(_quantized(weights, f"{prefix}intermediate.dense")).view()
        layer.down = kept(_quantized(weights, f"{prefix}output.dense")).view()
        layer.norm2_weight = floats(f"{prefix}output.LayerNorm.weight")
        layer.norm2_bias = floats(f"{prefix}output.LayerNorm.bias")
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    if (
        hidden % heads
        or (hidden // heads) % 16
        or hidden % 32
        or int(config["intermediate_size"]) % 32
    ):
        raise ValueError(f"hidden {hidden} / {heads} heads: beyond the BERT kernel")
    model = BertModel(
        hidden, int(config["intermediate_size"]), len(layers), heads,
        int(config["max_position_embeddings"]), float(config["layer_norm_eps"]),
        floats("embeddings.word_embeddings.weight"),
        floats("embeddings.position_embeddings.weight"),
        floats("embeddings.token_type_embeddings.weight"),
        floats("embeddings.LayerNorm.weight"), floats("embeddings.LayerNorm.bias"),
        ctypes.cast(kept(layers), ctypes.c_void_p),
    )  # fmt: skip
    return arrays, model
