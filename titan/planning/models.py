"""A model's shape, as the planner needs it: layers, widths, attention heads, MoE and MLA, and
the parameter counts that follow from them.

Parameter counts are computed from the shapes (SwiGLU MLPs: gate, up and down projections; RMS
norms; embeddings tied or not), so a table entry can be checked against its published size.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoeSpec:
    """Mixture of experts: each token runs ``num_experts_per_token`` of ``num_experts`` SwiGLU
    experts (plus the shared ones) in every MoE layer."""

    num_experts: int
    num_experts_per_token: int
    expert_intermediate_size: int
    num_shared_experts: int = 0
    # The leading layers that keep a dense MLP (DeepSeek's first_k_dense_replace).
    num_dense_layers: int = 0


@dataclass(frozen=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek-V2/V3): K and V are rebuilt from a compressed
    latent of ``kv_lora_rank`` values plus one shared RoPE key of ``qk_rope_head_dim``, and
    only those two are cached per token and layer."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None  # None: queries projected straight from the hidden state


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # of the dense MLP (MoE layers use MoeSpec's)
    vocab_size: int
    max_context: int
    tie_embeddings: bool = False
    has_qkv_bias: bool = False  # Qwen2
    moe: MoeSpec | None = None
    mla: MlaSpec | None = None
    # From a GGUF file: the bytes its tensors really take and its quantization (file type).
    file_weight_bytes: int | None = None
    file_format: str | None = None
    source: str = "built-in"

    def __post_init__(self) -> None:
        sizes = {
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_context": self.max_context,
        }
        bad = [f"{key}={value}" for key, value in sizes.items() if value < 1]
        if self.num_heads % max(self.num_kv_heads, 1):
            bad.append(f"num_heads ({self.num_heads}) not a multiple of num_kv_heads")
        if bad:
            raise ValueError(f"model {self.name!r}: invalid shape: {', '.join(bad)}")

    # ---- per layer ----------------------------------------------------------------------------

    @property
    def attention_params_per_layer(self) -> int:
        """Q, K, V and output projections (GQA), or MLA's low-rank projections."""
        hidden, heads = self.hidden_size, self.num_heads
        if self.mla is not None:
            mla = self.mla
            qk_head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
            if mla.q_lora_rank:
                rank = mla.q_lora_rank
                q = hidden * rank + rank + rank * heads * qk_head_dim  # down, norm, up
            else:
                q = hidden * heads * qk_head_dim
            kv_down = hidden * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank
            kv_up = mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
            return q + kv_down + kv_up + heads * mla.v_head_dim * hidden
        q_and_o = 2 * hidden * heads * self.head_dim
        k_and_v = 2 * hidden * self.num_kv_heads * self.head_dim
        bias = (heads + 2 * self.num_kv_heads) * self.head_dim if self.has_qkv_bias else 0
        return q_and_o + k_and_v + bias

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size  # gate, up, down

    @property
    def expert_params(self) -> int:
        """One MoE expert (a SwiGLU MLP of the expert width); 0 for a dense model."""
        return 3 * self.hidden_size * self.moe.expert_intermediate_size if self.moe else 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.moe.num_dense_layers if self.moe else 0

    def _moe_layer_params(self, moe: MoeSpec, num_routed: int) -> int:
        router = self.hidden_size * moe.num_experts
        return (num_routed + moe.num_shared_experts) * self.expert_params + router

    # ---- whole model --------------------------------------------------------------------------

    @property
    def embedding_params(self) -> int:
        """The token embedding and the output head (once when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def norm_params(self) -> int:
        return (2 * self.num_layers + 1) * self.hidden_size

    def _params(self, num_routed: int) -> int:
        num_dense = self.num_layers - self.num_moe_layers
        mlp = num_dense * self.dense_mlp_params
        if self.moe is not None:
            mlp += self.num_moe_layers * self._moe_layer_params(self.moe, num_routed)
        attention = self.num_layers * self.attention_params_per_layer
        return attention + mlp + self.embedding_params + self.norm_params

    @property
    def num_params(self) -> int:
        return self._params(self.moe.num_experts if self.moe else 0)

    @property
    def num_active_params(self) -> int:
        """Parameters one token runs through (MoE: its routed experts and the shared ones)."""
        return self._params(self.moe.num_experts_per_token if self.moe else 0)

    @property
    def num_linear_params(self) -> int:
        """The projection matrices: what weight quantization (fp8, int4, ...) shrinks."""
        return self.num_params - self.embedding_params - self.norm_params

    @property
    def attention_width(self) -> int:
        """Query-key dot product size summed over heads: attention FLOPs per (query, key) pair
        are 2 · this for QKᵀ plus 2 · heads · v_dim for PV."""
        if self.mla is not None:
            return self.num_heads * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
        return self.num_heads * self.head_dim

    @property
    def value_width(self) -> int:
        if self.mla is not None:
            return self.num_heads * self.mla.v_head_dim
        return self.num_heads * self.head_dim

    def expected_experts_touched(self, num_tokens: int) -> float:
        """Experts per MoE layer that ``num_tokens`` tokens route to, on average, if routing is
        uniform: E · (1 − (1 − k/E)^n). Decode reads only those experts' weights."""
        if self.moe is None:
            return 0.0
        experts, chosen = self.moe.num_experts, self.moe.num_experts_per_token
        return experts * (1.0 - (1.0 - chosen / experts) ** max(num_tokens, 0))
