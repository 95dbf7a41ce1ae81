"""all-MiniLM-L6-v2 on Titan's CPU kernels: the sentence-transformers pipeline (BERT, mean
pooling over the tokens, unit length) with every linear layer's weights in Q8_0 blocks and its
input quantized to int8 per block of 32, as the engine's quantized path does.

Why: a lookup embeds one short question, and the float32 model then streams its 42 MB of
weights for ~12 tokens (8.5 of torch's 14 ms went to the linear layers on a 2-core EPYC). Q8_0
weights are a quarter of that, and the int8 dot products are the kernels' own. The vectors stay
within cosine 0.999 of the float32 model's, 0.9997 on average (tests/cache/test_minilm.py).
Layer norms, GELU and attention over the question's few tokens stay float32, in torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from titan.kernels.library import CpuKernels
from titan.kernels.packing import Q8_0, PackedWeight, pack_gguf, quantize_q8_0

Vector = tuple[float, ...]
Rows = list[list[int]]  # per text: its token ids, or their segment types
# Rows per forward: a RAG file's hundreds of 256-token chunks in one would hold gigabytes of
# activations (the FFN's are 1,536 floats a token).
MAX_TOKENS = 2048


@dataclass(frozen=True)
class _Linear:
    weight: PackedWeight
    bias: np.ndarray  # float32 [rows]


@dataclass(frozen=True)
class _Layer:
    qkv: _Linear
    out: _Linear
    norm1: tuple[Any, Any]  # torch weight, bias
    up: _Linear
    down: _Linear
    norm2: tuple[Any, Any]


class QuantizedMiniLM:
    """``encode`` as sentence-transformers' for this model's directory (BERT + mean pooling +
    normalize); ``load`` refuses another pipeline with ValueError."""

    def __init__(self, kernels: CpuKernels, tokenizers: tuple[Any, Any], embeddings: dict[str, Any],
                 layers: list[_Layer], config: dict[str, Any]):  # fmt: skip
        self._kernels = kernels
        self._tokenizer, self._whole = tokenizers
        self._embeddings = embeddings
        self._layers = layers
        self._hidden = int(config["hidden_size"])
        self._heads = int(config["num_attention_heads"])
        self._eps = float(config["layer_norm_eps"])
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
        embeddings = {
            "word": weights["embeddings.word_embeddings.weight"],
            "position": weights["embeddings.position_embeddings.weight"],
            "type": weights["embeddings.token_type_embeddings.weight"],
            "norm": _norm(weights, "embeddings.LayerNorm"),
        }
        count = int(config["num_hidden_layers"])
        layers = [_layer(weights, f"encoder.layer.{i}.") for i in range(count)]
        return cls(kernels, (tokenizer, whole), embeddings, layers, config)

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
        import torch

        ids = [self._tokenizer.encode(text).ids for text in texts]
        types = [[0] * len(one) for one in ids]
        with torch.inference_mode():
            return [_pooled(states) for states in self._states(ids, types, torch)]

    def _states(self, ids: Rows, types: Rows, torch: Any, first_only: bool = False) -> list[Any]:
        """Each text's last-layer states (with ``first_only``, its first token's alone), in
        forwards of at most MAX_TOKENS rows (one long text alone)."""
        states: list[Any] = []
        start = 0
        while start < len(ids):
            end, rows = start, 0
            while end < len(ids) and (end == start or rows + len(ids[end]) <= MAX_TOKENS):
                rows += len(ids[end])
                end += 1
            states += self._forward(ids[start:end], types[start:end], torch, first_only)
            start = end
        return states

    def pair_states(self, pairs: list[tuple[str, str]]) -> list[Any]:
        """The [CLS] state of each pair of texts read together ([CLS] a [SEP] b [SEP], the
        second text's tokens of type 1), as a cross-encoder reads them."""
        import torch

        encodings = [self._tokenizer.encode(first, second) for first, second in pairs]
        ids = [encoding.ids for encoding in encodings]
        types = [encoding.type_ids for encoding in encodings]
        with torch.inference_mode():
            return [states[0] for states in self._states(ids, types, torch, first_only=True)]

    def _forward(self, ids: Rows, types: Rows, torch: Any, first_only: bool) -> list[Any]:
        """The last layer's states of each text; with ``first_only``, of its first token
        alone: the last layer's keys and values still come from every token, but its query,
        output projection and feed-forward run for that one row (a cross-encoder reads
        [CLS] alone: most of a layer's work of six, for a ~25-token pair)."""
        functional = torch.nn.functional
        hidden, heads = self._hidden, self._heads
        scale = (hidden // heads) ** -0.5
        lengths = [len(one) for one in ids]
        table = self._embeddings
        rows = [
            table["word"][one] + table["position"][: len(one)] + table["type"][kinds]
            for one, kinds in zip(ids, types, strict=True)
        ]
        x = torch.from_numpy(np.concatenate(rows))
        x = functional.layer_norm(x, (hidden,), *table["norm"], self._eps)
        for index, layer in enumerate(self._layers):
            last = first_only and index == len(self._layers) - 1
            qkv = self._linear(x, layer.qkv, torch).view(-1, 3, heads, hidden // heads)
            attended = []
            for text in qkv.split(lengths):
                q, k, v = text.permute(1, 2, 0, 3)  # each [heads, tokens, head_dim]
                q = q[:, :1] if last else q
                # softmax(q k^T / sqrt(d)) v, spelt out: half the time of torch's
                # scaled_dot_product_attention on a question's few tokens
                weights = torch.softmax(q @ k.transpose(1, 2) * scale, dim=-1)
                attended.append((weights @ v).transpose(0, 1).reshape(-1, hidden))
            if last:  # from here on, each text's first row alone
                x = x[np.cumsum([0, *lengths[:-1]]).tolist()]
                lengths = [1] * len(lengths)
            x = x + self._linear(torch.cat(attended), layer.out, torch)
            x = functional.layer_norm(x, (hidden,), *layer.norm1, self._eps)
            inner = functional.gelu(self._linear(x, layer.up, torch))
            x = x + self._linear(inner, layer.down, torch)
            x = functional.layer_norm(x, (hidden,), *layer.norm2, self._eps)
        return list(x.split(lengths))

    def _linear(self, x: Any, linear: _Linear, torch: Any) -> Any:
        rows = np.ascontiguousarray(x.numpy())
        return torch.from_numpy(self._kernels.qgemm(rows, linear.weight, linear.bias))


def _pooled(states: Any) -> Vector:
    """Mean pooling over the text's tokens, unit length (sentence-transformers' pipeline)."""
    import torch

    vector = torch.nn.functional.normalize(states.mean(0), dim=0)
    return tuple(float(value) for value in vector)


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


def _norm(weights: dict[str, Any], name: str) -> tuple[Any, Any]:
    import torch

    return (torch.from_numpy(weights[f"{name}.weight"].astype(np.float32)),
            torch.from_numpy(weights[f"{name}.bias"].astype(np.float32)))  # fmt: skip


def _layer(weights: dict[str, Any], prefix: str) -> _Layer:
    attention = prefix + "attention."
    return _Layer(
        qkv=_quantized(weights, *(f"{attention}self.{part}" for part in ("query", "key", "value"))),
        out=_quantized(weights, f"{attention}output.dense"),
        norm1=_norm(weights, f"{attention}output.LayerNorm"),
        up=_quantized(weights, f"{prefix}intermediate.dense"),
        down=_quantized(weights, f"{prefix}output.dense"),
        norm2=_norm(weights, f"{prefix}output.LayerNorm"),
    )
