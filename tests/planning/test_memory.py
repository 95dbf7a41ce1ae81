"""The planner's memory arithmetic against numbers worked out by hand (and published sizes)."""

from __future__ import annotations

import pytest

from titan.planning.gpus import GB, GpuSpec, gpu_by_name
from titan.planning.memory import (
    GPU_RUNTIME_OVERHEAD_BYTES,
    activation_bytes,
    kv_bytes_per_token,
    kv_dtype_bytes,
    plan_memory,
    weight_bytes,
    weight_format,
)
from titan.planning.model_catalog import BUILT_IN_MODELS, built_in_model


def model(name: str):  # type: ignore[no-untyped-def]
    found = built_in_model(name)
    assert found is not None, name
    return found


# ---- parameters -----------------------------------------------------------------------------


def test_llama_8b_parameters_by_hand():
    llama = model("Llama-3.1-8B")
    attention = 4096 * 4096 * 2 + 4096 * 1024 * 2  # Q and O; K and V with 8 KV heads of 128
    mlp = 3 * 4096 * 14336
    norms = 2 * 4096
    embeddings = 2 * 128256 * 4096  # untied
    expected = 32 * (attention + mlp + norms) + embeddings + 4096
    assert expected == 8_030_261_248  # the checkpoint's parameter count
    assert llama.num_params == expected == llama.num_active_params


@pytest.mark.parametrize(
    ("name", "published_total", "published_active"),
    [
        ("Llama-3.1-70B", 70.55e9, 70.55e9),
        ("Qwen2.5-7B", 7.62e9, 7.62e9),
        ("Qwen2.5-72B", 72.7e9, 72.7e9),
        ("Mistral-7B", 7.25e9, 7.25e9),
        ("Mixtral-8x7B", 46.7e9, 12.9e9),
        ("DeepSeek-V3", 671e9, 37.5e9),  # 37B active per the paper (embeddings aside)
    ],
)
def test_built_in_parameter_counts_match_the_published_sizes(
    name: str, published_total: float, published_active: float
):
    spec = model(name)
    assert spec.num_params == pytest.approx(published_total, rel=0.005)
    assert spec.num_active_params == pytest.approx(published_active, rel=0.01)


def test_the_built_in_table_covers_the_issue_list():
    names = {m.name for m in BUILT_IN_MODELS}
    assert {
        "Llama-3.1-8B",
        "Llama-3.1-70B",
        "Qwen2.5-7B",
        "Qwen2.5-72B",
        "Mistral-7B",
        "Mixtral-8x7B",
        "DeepSeek-V3",
    } <= names
    assert model("meta-llama/Llama-3.1-8B-Instruct").name == "Llama-3.1-8B"
    assert built_in_model("gpt-5") is None


# ---- KV cache -------------------------------------------------------------------------------


def test_llama_8b_kv_bytes_per_token_in_bf16():
    assert kv_bytes_per_token(model("Llama-3.1-8B"), 2) == 2 * 32 * 8 * 128 * 2 == 131_072


@pytest.mark.parametrize(
    ("name", "dtype_bytes", "tensor_parallel", "expected"),
    [
        ("Llama-3.1-70B", 2, 1, 2 * 80 * 8 * 128 * 2),  # 327,680
        ("Llama-3.1-70B", 2, 4, 2 * 80 * 2 * 128 * 2),  # 2 KV heads per GPU
        ("Llama-3.1-70B", 2, 16, 2 * 80 * 1 * 128 * 2),  # more ranks than heads: one copy each
        ("Llama-3.1-8B", 1, 1, 2 * 32 * 8 * 128 * 1),  # fp8 KV
        ("Mixtral-8x7B", 2, 1, 2 * 32 * 8 * 128 * 2),  # experts do not touch attention
        ("Qwen2.5-7B", 2, 1, 2 * 28 * 4 * 128 * 2),
        # MLA: layers × (kv_lora_rank + qk_rope_head_dim) × bytes, whole on every rank.
        ("DeepSeek-V3", 2, 1, 61 * (512 + 64) * 2),  # 70,272
        ("DeepSeek-V3", 2, 8, 61 * (512 + 64) * 2),
        ("DeepSeek-V3", 1, 8, 61 * (512 + 64) * 1),
    ],
)
def test_kv_bytes_per_token(name: str, dtype_bytes: int, tensor_parallel: int, expected: int):
    assert kv_bytes_per_token(model(name), dtype_bytes, tensor_parallel) == expected


def test_kv_dtype_auto_follows_the_activations():
    bf16 = weight_format("bf16", model("Llama-3.1-8B"))
    assert kv_dtype_bytes("auto", bf16) == 2
    assert kv_dtype_bytes("auto", weight_format("fp32", model("Llama-3.1-8B"))) == 4
    assert kv_dtype_bytes("fp8", bf16) == 1
    with pytest.raises(ValueError, match="unknown KV dtype"):
        kv_dtype_bytes("int3", bf16)


# ---- weights --------------------------------------------------------------------------------


def test_llama_8b_weight_bytes_by_format():
    llama = model("Llama-3.1-8B")
    embeddings, norms = 2 * 128256 * 4096, 65 * 4096
    linear = 8_030_261_248 - embeddings - norms
    assert weight_bytes(llama, weight_format("bf16", llama)) == 2 * 8_030_261_248
    # fp8 (and W8A8): projections in 1 byte, embeddings and head in 2, norms in 2.
    assert weight_bytes(llama, weight_format("fp8", llama)) == linear + 2 * embeddings + 2 * norms
    # AWQ/GPTQ: 4 bits + a 16-bit scale and a 4-bit zero per group of 128.
    int4 = weight_bytes(llama, weight_format("awq", llama))
    assert int4 == -(-linear * (4 + 20 / 128) // 8) + 2 * embeddings + 2 * norms
    assert weight_bytes(llama, weight_format("q4_0", llama)) == pytest.approx(
        (linear + embeddings) * 4.5 / 8 + 2 * norms, abs=1
    )


def test_weight_format_names():
    llama = model("Llama-3.1-8B")
    assert weight_format("auto", llama).name == "bf16"
    assert weight_format("bfloat16", llama).name == "bf16"
    assert weight_format("GPTQ", llama).compute_dtype == "bf16"
    assert weight_format("fp8", llama).compute_dtype == "fp8"
    with pytest.raises(ValueError, match="unknown dtype"):
        weight_format("int3", llama)


def test_deepseek_v3_in_fp8_needs_more_than_one_h200():
    deepseek = model("DeepSeek-V3")
    fp8 = weight_format("fp8", deepseek)
    total = weight_bytes(deepseek, fp8)
    assert total == pytest.approx(671e9 + deepseek.embedding_params, rel=0.01)
    h200 = gpu_by_name("H200")
    assert h200 is not None
    assert not plan_memory(deepseek, h200, fp8, 1, tensor_parallel=4).fits
    eight = plan_memory(deepseek, h200, fp8, 1, tensor_parallel=8)
    assert eight.fits and eight.weight_bytes_per_gpu == -(-total // 8)


# ---- KV capacity ----------------------------------------------------------------------------


def test_tokens_that_fit_by_hand():
    llama = model("Llama-3.1-8B")
    gpu = GpuSpec("test", 80 * GB, 3e12, 1e15, None)
    bf16 = weight_format("bf16", llama)
    plan = plan_memory(
        llama,
        gpu,
        bf16,
        2,
        gpu_memory_utilization=0.9,
        max_num_batched_tokens=2048,
        max_num_seqs=64,
    )
    # Activations: 2048 tokens × (4·4096 + 2·14336 + (32 + 16)·128) × 2 bytes, float32 logits
    # for 64 sequences over the 128,256-token vocabulary.
    expected_activations = 2048 * (4 * 4096 + 2 * 14336 + 48 * 128) * 2 + 64 * 128256 * 4
    assert activation_bytes(llama, 2048, 64, 1) == expected_activations
    kv_budget = 72 * GB - 16_060_522_496 - expected_activations - GPU_RUNTIME_OVERHEAD_BYTES
    assert plan.kv_bytes_per_gpu == kv_budget
    assert plan.num_kv_tokens == kv_budget // 131_072 // 16 * 16
    assert plan.num_kv_tokens == 416_736  # 50.9 GiB of KV


def test_tensor_parallel_splits_weights_and_kv_heads():
    llama = model("Llama-3.1-70B")
    h100 = gpu_by_name("H100")
    assert h100 is not None
    bf16 = weight_format("bf16", llama)
    assert not plan_memory(llama, h100, bf16, 2).fits  # 141 GB of weights on one 80 GB GPU
    four = plan_memory(llama, h100, bf16, 2, tensor_parallel=4)
    assert four.weight_bytes_per_gpu == -(-weight_bytes(llama, bf16) // 4)
    assert four.kv_bytes_per_token_per_gpu == 327_680 // 4
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        plan_memory(llama, h100, bf16, 2, gpu_memory_utilization=1.5)
