"""The roofline: a step takes as long as the slower of its arithmetic (at the GPU's peak FLOP/s
times an efficiency) and its memory traffic (at the memory bandwidth times an efficiency), plus
a fixed per-step overhead and, with tensor parallelism, the all-reduces.

Prefill is compute-bound (thousands of tokens share each weight read); decode is bandwidth-bound
(every step reads all the weights and every sequence's KV cache for a handful of tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from titan.planning.gpus import GpuSpec
from titan.planning.memory import WeightFormat, kv_bytes_per_token, weight_bytes
from titan.planning.models import ModelSpec
from titan.planning.step_cost import attention_pairs

# Achieved / peak: ~50% MFU is what good prefill kernels reach at large batches; ~80% of the
# memory bandwidth for decode's streaming reads.
COMPUTE_EFFICIENCY = 0.5
BANDWIDTH_EFFICIENCY = 0.8
# Scheduling, sampling and kernel launches per step (CUDA graphs keep decode launches cheap).
GPU_STEP_OVERHEAD_S = 0.0015
# A CPU engine runs each layer's ops from Python: the embedded engine's 30-layer model spent
# ~45 ms per step on a 2-core VM, about half of it beyond reading the weights.
CPU_STEP_OVERHEAD_S = 0.02
# One ring all-reduce per attention and per MLP block: latency per call on NVLink-class links.
ALLREDUCE_LATENCY_S = 10e-6
INTERCONNECT_BANDWIDTH = 300e9  # bytes/s each way, effective (NVLink; PCIe cards get far less)


@dataclass(frozen=True)
class RooflineStepCost:
    model: ModelSpec
    gpu: GpuSpec
    weights: WeightFormat
    kv_dtype_bytes: int
    tensor_parallel: int = 1
    compute_efficiency: float = COMPUTE_EFFICIENCY
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    step_overhead_s: float | None = None  # None: GPU_ or CPU_STEP_OVERHEAD_S

    # ---- the pieces ---------------------------------------------------------------------------

    @cached_property
    def _weight_bytes(self) -> int:
        return weight_bytes(self.model, self.weights)

    @cached_property
    def _kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.model, self.kv_dtype_bytes, self.tensor_parallel)

    @cached_property
    def _overhead_s(self) -> float:
        if self.step_overhead_s is not None:
            return self.step_overhead_s
        return CPU_STEP_OVERHEAD_S if self.gpu.is_cpu else GPU_STEP_OVERHEAD_S

    @cached_property
    def _peak_flops(self) -> float:
        return self.gpu.flops_for(self.weights.compute_dtype) * self.tensor_parallel

    def matmul_flops(self, num_tokens: int, num_seqs: int) -> float:
        """2 FLOPs per active weight per token, the output head only for sampled rows."""
        model = self.model
        head = model.vocab_size * model.hidden_size
        body = model.num_active_params - model.embedding_params - model.norm_params
        return 2.0 * (body * num_tokens + head * num_seqs)

    def attention_flops(self, num_pairs: int) -> float:
        """Per (query, key) pair and layer: 2 · heads · qk_dim (QKᵀ) + 2 · heads · v_dim (PV)."""
        model = self.model
        return 2.0 * (model.attention_width + model.value_width) * model.num_layers * num_pairs

    def weight_bytes_read(self, num_tokens: int) -> float:
        """All the weights of one rank, except MoE experts no token in the step routes to."""
        model = self.model
        total = float(self._weight_bytes)
        if model.moe is not None:
            bytes_per_param = total / model.num_params
            experts = model.num_moe_layers * model.moe.num_experts * model.expert_params
            touched = model.expected_experts_touched(num_tokens) / model.moe.num_experts
            total -= experts * (1.0 - touched) * bytes_per_param
        return total / self.tensor_parallel

    def kv_bytes_moved(self, num_tokens: int, num_context_tokens: int) -> float:
        """Each sequence reads its cached context once per layer and writes its new tokens."""
        return float(self._kv_bytes_per_token * (num_context_tokens + num_tokens))

    def allreduce_seconds(self, num_tokens: int) -> float:
        tp = self.tensor_parallel
        if tp == 1:
            return 0.0
        calls = 2 * self.model.num_layers
        payload = num_tokens * self.model.hidden_size * 2 * 2 * (tp - 1) / tp  # ring, 16-bit
        return calls * ALLREDUCE_LATENCY_S + calls * payload / INTERCONNECT_BANDWIDTH

    # ---- StepCost -----------------------------------------------------------------------------

    def seconds(
        self, num_tokens: int, num_seqs: int, num_pairs: int, num_context_tokens: int
    ) -> float:
        flops = self.matmul_flops(num_tokens, num_seqs) + self.attention_flops(num_pairs)
        compute_s = flops / (self._peak_flops * self.compute_efficiency)
        moved = self.weight_bytes_read(num_tokens) + self.kv_bytes_moved(
            num_tokens, num_context_tokens
        )
        memory_s = moved / (self.gpu.memory_bandwidth * self.bandwidth_efficiency)
        return self._overhead_s + max(compute_s, memory_s) + self.allreduce_seconds(num_tokens)

    # ---- throughputs --------------------------------------------------------------------------

    def prefill_tokens_per_s(self, num_prompt_tokens: int) -> float:
        """One prompt prefilled in one step."""
        pairs = attention_pairs(0, num_prompt_tokens)
        return num_prompt_tokens / self.seconds(num_prompt_tokens, 1, pairs, 0)

    def decode_tokens_per_s(self, batch_size: int, context_tokens: int) -> float:
        """``batch_size`` sequences of ``context_tokens`` each, one token each per step."""
        context = batch_size * context_tokens
        return batch_size / self.seconds(batch_size, batch_size, context, context)

    def is_compute_bound(self, num_tokens: int, num_seqs: int, context_tokens: int) -> bool:
        pairs = num_seqs * context_tokens
        flops = self.matmul_flops(num_tokens, num_seqs) + self.attention_flops(pairs)
        moved = self.weight_bytes_read(num_tokens) + self.kv_bytes_moved(num_tokens, pairs)
        return flops / (self._peak_flops * self.compute_efficiency) > moved / (
            self.gpu.memory_bandwidth * self.bandwidth_efficiency
        )
