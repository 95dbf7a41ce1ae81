"""Where a ModelSpec comes from: the built-in table, an HF ``config.json``, or a GGUF file's
metadata (whose tensors also say how many bytes the weights really take)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from titan.errors import ConfigError
from titan.planning.gguf_header import GgufHeader, read_gguf_header
from titan.planning.model_catalog import BUILT_IN_MODELS, built_in_model
from titan.planning.models import MlaSpec, ModelSpec, MoeSpec

# llama.cpp's general.file_type values (llama_ftype) for the common quantizations.
_GGUF_FILE_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 7: "q8_0", 8: "q5_0", 9: "q5_1",
                    10: "q2_k", 11: "q3_k", 12: "q3_k", 13: "q3_k", 14: "q4_k", 15: "q4_k",
                    16: "q5_k", 17: "q5_k", 18: "q6_k", 32: "bf16"}  # fmt: skip


def resolve_model(text: str) -> ModelSpec:
    """A built-in name, a ``config.json`` (or a directory holding one), or a ``.gguf`` file.
    Raises ConfigError with the names it knows when ``text`` is none of these."""
    model = built_in_model(text)
    if model is not None:
        return model
    path = Path(text).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file() and path.suffix == ".gguf":
        return model_from_gguf(path)
    if path.is_file():
        return model_from_hf_config(path)
    names = ", ".join(model.name for model in BUILT_IN_MODELS)
    raise ConfigError(
        f"unknown model {text!r}: give a built-in name ({names}), a config.json or a .gguf file"
    )


# ---- HF config.json --------------------------------------------------------------------------


def model_from_hf_config(path: Path) -> ModelSpec:
    try:
        config = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: a config.json is a JSON object")
    # Multimodal configs nest the language model's.
    text_config = config.get("text_config")
    if isinstance(text_config, dict):
        config = {**config, **text_config}
    name = path.parent.name if path.name == "config.json" else path.stem
    try:
        return _spec_from_hf(config, name or "model", str(path))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: not a decoder config the planner understands: {exc}") from None


def _spec_from_hf(config: dict[str, Any], name: str, source: str) -> ModelSpec:
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    experts = config.get("num_local_experts") or config.get("n_routed_experts")
    experts = experts or config.get("num_experts")
    moe = None
    if experts:
        moe = MoeSpec(
            num_experts=int(experts),
            num_experts_per_token=int(config["num_experts_per_tok"]),
            expert_intermediate_size=int(
                config.get("moe_intermediate_size") or config["intermediate_size"]
            ),
            num_shared_experts=int(config.get("n_shared_experts") or 0),
            num_dense_layers=int(config.get("first_k_dense_replace") or 0),
        )
    mla = None
    if config.get("kv_lora_rank"):
        mla = MlaSpec(
            kv_lora_rank=int(config["kv_lora_rank"]),
            qk_rope_head_dim=int(config["qk_rope_head_dim"]),
            qk_nope_head_dim=int(config["qk_nope_head_dim"]),
            v_head_dim=int(config["v_head_dim"]),
            q_lora_rank=int(config["q_lora_rank"]) if config.get("q_lora_rank") else None,
        )
    head_dim = config.get("head_dim") or hidden // heads
    if mla is not None:
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    model_type = str(config.get("model_type", ""))
    return ModelSpec(
        name=name,
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        max_context=int(config.get("max_position_embeddings") or 4096),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        has_qkv_bias=bool(config.get("attention_bias")) or model_type.startswith("qwen2"),
        moe=moe,
        mla=mla,
        source=source,
    )


# ---- GGUF ------------------------------------------------------------------------------------


def model_from_gguf(path: Path) -> ModelSpec:
    header = read_gguf_header(path)
    try:
        return _spec_from_gguf(header, path)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: GGUF metadata the planner cannot use: {exc}") from None


def _spec_from_gguf(header: GgufHeader, path: Path) -> ModelSpec:
    meta = header.metadata
    arch = str(meta["general.architecture"])

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        # Per-layer arrays (some architectures): the widest layer plans safely.
        return max(value) if isinstance(value, list) and value else value

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    tensor_names = {tensor.name for tensor in header.tensors}
    vocab = get("vocab_size") or meta.get("tokenizer.ggml.tokens")
    if isinstance(vocab, list):
        vocab = len(vocab)
    moe = None
    if get("expert_count"):
        moe = MoeSpec(
            num_experts=int(get("expert_count")),
            num_experts_per_token=int(get("expert_used_count")),
            expert_intermediate_size=int(
                get("expert_feed_forward_length") or get("feed_forward_length")
            ),
            num_shared_experts=int(get("expert_shared_count", 0)),
            num_dense_layers=int(get("leading_dense_block_count", 0)),
        )
    mla = None
    if get("attention.kv_lora_rank"):
        rope = int(get("rope.dimension_count"))
        key_length = int(get("attention.key_length_mla") or get("attention.key_length"))
        mla = MlaSpec(
            kv_lora_rank=int(get("attention.kv_lora_rank")),
            qk_rope_head_dim=rope,
            qk_nope_head_dim=key_length - rope,
            v_head_dim=int(get("attention.value_length_mla") or get("attention.value_length")),
            q_lora_rank=int(get("attention.q_lora_rank")) if get("attention.q_lora_rank") else None,
        )
    head_dim = int(get("attention.key_length") or hidden // heads)
    if mla is not None:
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    file_type = meta.get("general.file_type")
    return ModelSpec(
        name=path.stem.split(".")[0],
        num_layers=int(get("block_count")),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv") or heads),
        head_dim=head_dim,
        intermediate_size=int(get("feed_forward_length")),
        vocab_size=int(vocab),
        max_context=int(get("context_length") or 4096),
        tie_embeddings="output.weight" not in tensor_names,
        has_qkv_bias="blk.0.attn_q.bias" in tensor_names,
        moe=moe,
        mla=mla,
        file_weight_bytes=sum(tensor.num_bytes for tensor in header.tensors),
        file_format=_GGUF_FILE_TYPES.get(file_type, _dominant_type(header)),
        source=str(path),
    )


def _dominant_type(header: GgufHeader) -> str:
    """The tensor type holding the most bytes: the file's quantization when its file type is
    not one named above."""
    totals: dict[str, int] = {}
    for tensor in header.tensors:
        totals[tensor.type_name] = totals.get(tensor.type_name, 0) + tensor.num_bytes
    return max(totals, key=lambda name: totals[name]).lower()
