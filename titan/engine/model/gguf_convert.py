"""Convert a GGUF file into an HF-format directory, once, cached by the file's hash.

Parsing a GGUF header and dequantizing takes seconds; the cached directory (config.json,
model.safetensors in float32, tokenizer.json, tokenizer_config.json) loads in about one. The same
directory format is what ``titan --model DIR`` serves, so there is one loading path.

The file's own quantized blocks are kept too, in ``quantized/blocks.safetensors`` (each matrix as
uint8 ``[rows, cols / 32, block bytes]``, its format in the metadata, Q and K rows unpermuted like
the floats): the CPU kernels run them as they are. Matrices in other GGUF formats (F16, K-quants)
are stored there as Q8_0, quantized from their float values.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from titan.engine.model.gguf_tokenizer import tokenizer_from_gguf
from titan.errors import ModelLoadError
from titan.kernels import packing

log = logging.getLogger(__name__)

CONVERTER_VERSION = "2"  # 2: quantized/blocks.safetensors
SUPPORTED_GGUF_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def cached_hf_dir(gguf_path: Path, cache_root: Path) -> Path:
    """The HF directory for ``gguf_path``, converting it first if it is not cached yet."""
    key = f"{gguf_path.stem}-{file_digest(gguf_path)[:16]}-v{CONVERTER_VERSION}"
    target = cache_root / key
    if (target / "model.safetensors").exists():
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # Convert into a temporary sibling, then rename: a crash never leaves half a cache entry,
    # and two processes converting at once both end with a complete directory.
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_root))
    try:
        convert_gguf(gguf_path, staging)
        try:
            os.replace(staging, target)
        except OSError:
            if not (target / "model.safetensors").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("converted %s to %s in %.1fs", gguf_path, target, time.perf_counter() - started)
    return target


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    # Imported here: gguf and safetensors are only needed on the first start of a GGUF model.
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.numpy import save_file

    try:
        reader = GGUFReader(str(gguf_path))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{gguf_path}: not a readable GGUF file ({exc})") from exc
    metadata = {name: field.contents() for name, field in reader.fields.items()}
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHS:
        raise ModelLoadError(
            f"{gguf_path}: GGUF architecture {arch!r} is not supported "
            f"({', '.join(SUPPORTED_GGUF_ARCHS)} are)"
        )
    config = _hf_config(metadata, arch)
    tensors: dict[str, np.ndarray] = {}
    blocks: dict[str, np.ndarray] = {}
    formats: dict[str, str] = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        if name is None:
            continue
        weights = np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type), np.float32)
        # llama.cpp stores Q and K rows permuted for its interleaved RoPE; undo it for HF's
        # rotate-half layout.
        order = None
        if name.endswith("q_proj.weight"):
            order = _unpermuted_rows(weights.shape[0], config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            order = _unpermuted_rows(weights.shape[0], config["num_key_value_heads"])
        tensors[name] = weights if order is None else weights[order]
        if weights.ndim == 2 and weights.shape[1] % packing.QK == 0:
            fmt, raw = _blocks(tensor, weights)
            blocks[name] = raw if order is None else raw[order]
            formats[name] = packing.FORMAT_NAMES[fmt]
    config["tie_word_embeddings"] = "lm_head.weight" not in tensors
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "quantized").mkdir()
    save_file(blocks, str(out_dir / "quantized" / "blocks.safetensors"), metadata=formats)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer_from_gguf(metadata).save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(_tokenizer_config(metadata), indent=2)
    )


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name.startswith("blk."):
        _, layer, rest = gguf_name.split(".", 2)
        part, _, kind = rest.rpartition(".")
        if part in _LAYER_NAMES:
            return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"
    if gguf_name == "rope_freqs.weight":
        return None  # derived from rope_scaling instead
    raise ModelLoadError(f"unexpected tensor {gguf_name!r} in the GGUF file")


def _unpermuted_rows(rows: int, num_heads: int) -> np.ndarray:
    """The row order that undoes llama.cpp's Q/K permutation (rows move whole, so quantized
    blocks follow the same order as the floats)."""
    half = rows // num_heads // 2
    return np.arange(rows).reshape(num_heads, half, 2).swapaxes(1, 2).reshape(rows)


def _blocks(tensor: Any, weights: np.ndarray) -> tuple[int, np.ndarray]:
    """A matrix's GGUF blocks when the CPU kernels run its format, else Q8_0 from its floats."""
    from gguf import GGMLQuantizationType

    rows, cols = weights.shape
    native = {GGMLQuantizationType.Q4_1: packing.Q4_1, GGMLQuantizationType.Q8_0: packing.Q8_0}
    fmt = native.get(tensor.tensor_type)
    if fmt is None:
        return packing.Q8_0, packing.quantize_q8_0(weights)
    return fmt, packing.gguf_blocks(np.asarray(tensor.data), fmt, rows, cols)


def _hf_config(metadata: dict[str, Any], arch: str) -> dict[str, Any]:
    def get(key: str, default: Any = None) -> Any:
        return metadata.get(f"{arch}.{key}", default)

    num_heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    config: dict[str, Any] = {
        "architectures": [SUPPORTED_GGUF_ARCHS[arch]],
        "model_type": arch,
        "vocab_size": int(get("vocab_size") or len(metadata["tokenizer.ggml.tokens"])),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(get("attention.head_count_kv") or num_heads),
        "head_dim": int(get("attention.key_length") or hidden // num_heads),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 2048)),
        "bos_token_id": metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata.get("tokenizer.ggml.eos_token_id"),
        "attention_bias": arch == "qwen2",
        "torch_dtype": "float32",
    }
    scaling_type = get("rope.scaling.type")
    if scaling_type == "linear":
        config["rope_scaling"] = {
            "rope_type": "linear",
            "factor": float(get("rope.scaling.factor")),
        }
    elif scaling_type not in (None, "none"):
        raise ModelLoadError(f"GGUF rope scaling {scaling_type!r} is not supported")
    return config


def _tokenizer_config(metadata: dict[str, Any]) -> dict[str, Any]:
    tokens = metadata["tokenizer.ggml.tokens"]

    def token(key: str) -> str | None:
        index = metadata.get(key)
        return tokens[index] if index is not None and 0 <= index < len(tokens) else None

    return {
        "chat_template": metadata.get("tokenizer.chat_template"),
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
    }
