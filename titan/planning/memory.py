"""Memory arithmetic: weight bytes by format, KV bytes per token (GQA and MLA), and how many
tokens of KV fit beside the weights on each GPU of a tensor-parallel replica."""

from __future__ import annotations

import math
from dataclasses import dataclass

from titan.planning.gpus import GpuSpec
from titan.planning.models import ModelSpec

GIB = 2**30
# CUDA context, cuBLAS workspaces, CUDA graphs and NCCL buffers: memory the framework holds
# outside the weights, activations and KV cache (vLLM's "non-torch" memory is ~0.5–1.5 GiB).
GPU_RUNTIME_OVERHEAD_BYTES = 1 * GIB
CPU_RUNTIME_OVERHEAD_BYTES = GIB // 4


@dataclass(frozen=True)
class WeightFormat:
    name: str
    linear_bits: float  # bits per weight of the projection matrices, scales and zeros included
    embedding_bits: float  # the token embedding and the output head
    compute_dtype: str  # the matmul rate it gets: bf16, fp8, int8, fp32


def _int4_bits(group_size: int = 128) -> float:
    """AWQ/GPTQ: 4-bit weights, one fp16 scale and one 4-bit zero per group of 128."""
    return 4 + (16 + 4) / group_size


# GGUF block formats keep their own embeddings quantized; vLLM's fp8/int8/int4 keep the
# embedding and head in 16 bits. Weight-only formats compute in bf16 after dequantizing.
WEIGHT_FORMATS: dict[str, WeightFormat] = {
    fmt.name: fmt
    for fmt in (
        WeightFormat("fp32", 32, 32, "fp32"),
        WeightFormat("bf16", 16, 16, "bf16"),
        WeightFormat("fp16", 16, 16, "bf16"),
        WeightFormat("fp8", 8, 16, "fp8"),
        WeightFormat("int8", 8, 16, "int8"),  # W8A8
        WeightFormat("int4", _int4_bits(), 16, "bf16"),
        WeightFormat("awq", _int4_bits(), 16, "bf16"),
        WeightFormat("gptq", _int4_bits(), 16, "bf16"),
        # GGUF: bytes per block × 8 / values per block.
        WeightFormat("q2_k", 2.625, 2.625, "bf16"),
        WeightFormat("q3_k", 3.4375, 3.4375, "bf16"),
        WeightFormat("q4_0", 4.5, 4.5, "bf16"),
        WeightFormat("q4_1", 5.0, 5.0, "bf16"),
        WeightFormat("q4_k", 4.5, 4.5, "bf16"),
        WeightFormat("q5_0", 5.5, 5.5, "bf16"),
        WeightFormat("q5_1", 6.0, 6.0, "bf16"),
        WeightFormat("q5_k", 5.5, 5.5, "bf16"),
        WeightFormat("q6_k", 6.5625, 6.5625, "bf16"),
        WeightFormat("q8_0", 8.5, 8.5, "bf16"),
    )
}
_FORMAT_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "w4a16": "int4",
    "w8a8": "int8",
    "f16": "fp16",
    "f32": "fp32",
    "fp8_e4m3": "fp8",
}
KV_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def weight_format(name: str, model: ModelSpec) -> WeightFormat:
    """``auto``: a GGUF file's own format, else bf16. Raises ValueError for unknown names."""
    key = name.strip().lower()
    if key == "auto":
        key = model.file_format or "bf16"
    key = _FORMAT_ALIASES.get(key, key)
    if key not in WEIGHT_FORMATS:
        raise ValueError(f"unknown dtype {name!r}: one of auto, {', '.join(WEIGHT_FORMATS)}")
    return WEIGHT_FORMATS[key]


def kv_dtype_bytes(name: str, weights: WeightFormat) -> int:
    """``auto``: the model's activation dtype (fp32 for fp32 weights, else 16-bit)."""
    key = _FORMAT_ALIASES.get(name.strip().lower(), name.strip().lower())
    if key == "auto":
        return 4 if weights.compute_dtype == "fp32" else 2
    if key not in KV_DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {name!r}: one of auto, {', '.join(KV_DTYPE_BYTES)}")
    return KV_DTYPE_BYTES[key]


def weight_bytes(model: ModelSpec, fmt: WeightFormat) -> int:
    """Projection matrices at ``linear_bits``, embedding and head at ``embedding_bits``, norms
    in 16 bits. A GGUF model in its own format: the bytes its tensors take in the file."""
    if model.file_weight_bytes is not None and fmt.name == model.file_format:
        return model.file_weight_bytes
    bits = model.num_linear_params * fmt.linear_bits + model.embedding_params * fmt.embedding_bits
    return math.ceil(bits / 8) + 2 * model.norm_params


def kv_heads_per_gpu(model: ModelSpec, tensor_parallel: int) -> int:
    """KV heads split across ranks; with more ranks than heads each rank keeps a copy of one."""
    return math.ceil(model.num_kv_heads / tensor_parallel)


def kv_bytes_per_token(model: ModelSpec, dtype_bytes: int, tensor_parallel: int = 1) -> int:
    """KV cache bytes one token adds on each GPU of a replica.

    GQA: 2 (K and V) · layers · KV heads (per rank) · head_dim · bytes.
    MLA: layers · (kv_lora_rank + qk_rope_head_dim) · bytes: the latent and the shared RoPE key
    are cached instead of K and V, and every rank keeps the whole latent (heads are split after
    the up-projection)."""
    if model.mla is not None:
        mla = model.mla
        return model.num_layers * (mla.kv_lora_rank + mla.qk_rope_head_dim) * dtype_bytes
    heads = kv_heads_per_gpu(model, tensor_parallel)
    return 2 * model.num_layers * heads * model.head_dim * dtype_bytes


def activation_bytes(
    model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int, tensor_parallel: int
) -> int:
    """Peak activation memory of one forward pass at the full token budget (an estimate, per
    GPU): the residual stream and normed copy, Q/K/V, the MLP's gate and up outputs (for MoE the
    routed experts' share), in 16 bits; and float32 logits for every sampled sequence."""
    if model.moe is not None:
        moe = model.moe
        mlp_width = moe.expert_intermediate_size * (
            moe.num_experts_per_token + moe.num_shared_experts
        )
        mlp_width = max(mlp_width, model.intermediate_size if moe.num_dense_layers else 0)
    else:
        mlp_width = model.intermediate_size
    qkv_width = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim
    per_token = 4 * model.hidden_size + (2 * mlp_width + qkv_width) / tensor_parallel
    logits = max_num_seqs * model.vocab_size / tensor_parallel * 4
    return math.ceil(max_num_batched_tokens * per_token * 2 + logits)


@dataclass(frozen=True)
class MemoryPlan:
    weight_bytes: int  # the whole model
    weight_bytes_per_gpu: int
    activation_bytes_per_gpu: int
    runtime_overhead_bytes_per_gpu: int
    usable_bytes_per_gpu: int  # memory × gpu_memory_utilization
    kv_bytes_per_token_per_gpu: int
    kv_bytes_per_gpu: int  # what is left for the KV cache (negative: the model does not fit)
    num_kv_tokens: int  # tokens of KV one replica holds (whole blocks)

    @property
    def fits(self) -> bool:
        return self.num_kv_tokens > 0

    @property
    def kv_bytes_per_token(self) -> int:
        """Per token on one GPU; the replica's total is this × the GPUs (GQA) or a copy per GPU
        (MLA)."""
        return self.kv_bytes_per_token_per_gpu


def plan_memory(
    model: ModelSpec,
    gpu: GpuSpec,
    fmt: WeightFormat,
    kv_bytes: int,
    tensor_parallel: int = 1,
    gpu_memory_utilization: float = 0.9,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    block_size: int = 16,
) -> MemoryPlan:
    """KV capacity per GPU = memory × utilization − weights ÷ TP − activations − runtime
    overhead; tokens that fit = that ÷ KV bytes per token per GPU, in whole blocks."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if tensor_parallel < 1:
        raise ValueError(f"tensor parallel size must be >= 1, got {tensor_parallel}")
    total_weights = weight_bytes(model, fmt)
    per_gpu_weights = math.ceil(total_weights / tensor_parallel)
    activations = activation_bytes(model, max_num_batched_tokens, max_num_seqs, tensor_parallel)
    overhead = CPU_RUNTIME_OVERHEAD_BYTES if gpu.is_cpu else GPU_RUNTIME_OVERHEAD_BYTES
    usable = int(gpu.memory_bytes * gpu_memory_utilization)
    per_token = kv_bytes_per_token(model, kv_bytes, tensor_parallel)
    kv_budget = usable - per_gpu_weights - activations - overhead
    num_tokens = max(0, kv_budget // per_token // block_size * block_size)
    return MemoryPlan(
        total_weights,
        per_gpu_weights,
        activations,
        overhead,
        usable,
        per_token,
        kv_budget,
        num_tokens,
    )
