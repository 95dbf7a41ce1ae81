"""The Llama-family decoder: RMSNorm, RoPE, grouped-query attention over the paged cache, SwiGLU.

Weights are plain tensors (no nn.Module): Q/K/V and gate/up projections are fused at load so a
layer runs three matmuls plus the output projection.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from titan.engine.model.attention import AttentionMetadata, paged_attention, write_kv
from titan.engine.model.config import ModelConfig
from titan.engine.model.rope import RotaryEmbedding, apply_rotary
from titan.errors import ModelLoadError


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None
    o_proj: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor


# CPU GEMMs take other code paths for very few rows (MKL's float32 GEMM below ~7), whose
# rounding differs. Padding small batches to this many rows keeps each row's result independent
# of how many other rows share the step. (bfloat16 looked row-invariant in isolated matmuls, but
# the model's outputs were not without the padding: it stays on for every CPU dtype.)
MIN_GEMM_ROWS = 8
# Row counts a step's GEMM sees, from a padded decode to a long prefill chunk.
PROBED_ROWS = (MIN_GEMM_ROWS, 16, 32, 33, 64, 65, 128, 256, 512)
# Logits of this many top candidates are recomputed in float32 (see compute_logits).
REFINED_LOGITS = 32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalized in float32, returned in the weights' dtype (HF's order of operations)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(weight.dtype)


class LlamaForCausalLM:
    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype,
        max_positions: int,
    ):
        self.config = config
        self.device = device
        self.dtype = dtype
        self.scale = config.head_dim**-0.5

        def take(name: str) -> torch.Tensor:
            try:
                tensor = weights.pop(name)
            except KeyError as exc:
                raise ModelLoadError(f"weight {name!r} is missing from the checkpoint") from exc
            return tensor.to(device=device, dtype=dtype)

        self.embed_tokens = take("model.embed_tokens.weight")
        self.layers = []
        for index in range(config.num_hidden_layers):
            prefix = f"model.layers.{index}."
            attn = prefix + "self_attn."
            qkv = torch.cat([take(attn + f"{p}_proj.weight") for p in "qkv"])
            qkv_bias = None
            if config.attention_bias:
                qkv_bias = torch.cat([take(attn + f"{p}_proj.bias") for p in "qkv"])
            gate_up = torch.cat(
                [take(prefix + "mlp.gate_proj.weight"), take(prefix + "mlp.up_proj.weight")]
            )
            self.layers.append(
                LayerWeights(
                    input_norm=take(prefix + "input_layernorm.weight"),
                    qkv=qkv,
                    qkv_bias=qkv_bias,
                    o_proj=take(attn + "o_proj.weight"),
                    post_norm=take(prefix + "post_attention_layernorm.weight"),
                    gate_up=gate_up,
                    down=take(prefix + "mlp.down_proj.weight"),
                )
            )
        self.norm = take("model.norm.weight")
        if config.tie_word_embeddings or "lm_head.weight" not in weights:
            self.lm_head = self.embed_tokens
        else:
            self.lm_head = take("lm_head.weight")
        self.rotary = RotaryEmbedding(config, max_positions, device, dtype)
        self._pads_small_batches = device.type == "cpu"

    def _linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        num_rows = x.shape[0]
        if num_rows >= MIN_GEMM_ROWS or not self._pads_small_batches:
            return F.linear(x, weight, bias)
        padded = x.new_zeros(MIN_GEMM_ROWS, x.shape[1])
        padded[:num_rows] = x
        return F.linear(padded, weight, bias)[:num_rows]

    def gemms_are_row_invariant(self) -> bool:
        """Whether each row of the layers' GEMMs is the same bits whatever the number of rows,
        which makes a request's output independent of its batch (with the CPU attention kernel).

        True with MKL's float32; oneDNN's AMX bfloat16 kernels choose their blocking by row
        count, so there (as on CUDA) the output may depend on the batch. Probed, not assumed.
        """
        layer = self.layers[0]
        generator = torch.Generator().manual_seed(0)
        for weight in (layer.qkv, layer.o_proj, layer.gate_up, layer.down):
            rows = torch.randn(max(PROBED_ROWS), weight.shape[1], generator=generator)
            rows = rows.to(self.device, self.dtype)
            reference = F.linear(rows, weight)
            for num_rows in PROBED_ROWS:
                if not torch.equal(self._linear(rows[:num_rows], weight), reference[:num_rows]):
                    return False
        return True

    @property
    def num_parameters(self) -> int:
        tensors = [self.embed_tokens, self.norm]
        for layer in self.layers:
            tensors += [
                layer.input_norm,
                layer.qkv,
                layer.o_proj,
                layer.post_norm,
                layer.gate_up,
                layer.down,
            ]
        if self.lm_head is not self.embed_tokens:
            tensors.append(self.lm_head)
        return sum(t.numel() for t in tensors)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """input_ids, positions: [T] -> final hidden states [T, hidden]."""
        config = self.config
        num_heads, num_kv_heads, head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        eps = config.rms_norm_eps
        cos, sin = self.rotary.lookup(positions)
        # The residual stream stays in float32 whatever the weights' dtype: bfloat16 sums over 30
        # layers drift far enough to flip the model's near-ties (measured: "What is the capital
        # of France?" answered "L'Étoile..." instead of "The capital of France is Paris.").
        # Matmuls still run in the weights' dtype; the extra cost is a few casts per layer.
        hidden = F.embedding(input_ids, self.embed_tokens).float()
        num_tokens = hidden.shape[0]
        for layer, (cache_k, cache_v) in zip(self.layers, kv_caches, strict=True):
            x = rms_norm(hidden, layer.input_norm, eps)
            qkv = self._linear(x, layer.qkv, layer.qkv_bias)
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q = apply_rotary(q.view(num_tokens, num_heads, head_dim), cos, sin)
            k = apply_rotary(k.view(num_tokens, num_kv_heads, head_dim), cos, sin)
            write_kv(cache_k, cache_v, k, v.view(num_tokens, num_kv_heads, head_dim), meta)
            attn = paged_attention(q, cache_k, cache_v, meta, num_kv_heads, self.scale)
            hidden = hidden + self._linear(attn, layer.o_proj)
            x = rms_norm(hidden, layer.post_norm, eps)
            gate, up = self._linear(x, layer.gate_up).chunk(2, dim=-1)
            hidden = hidden + self._linear(F.silu(gate) * up, layer.down)
        return rms_norm(hidden, self.norm, eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> float32 logits [N, vocab].

        In bfloat16 a logit near 20 is only known to ~0.1, so near-ties between the best
        candidates are decided by rounding. The top candidates are recomputed in float32: greedy
        picks and their logprobs match a float32 model's, at a small fraction of its cost.
        """
        logits = self._linear(hidden, self.lm_head).float()
        if self.dtype == torch.float32:
            return logits
        top = logits.topk(min(REFINED_LOGITS, logits.shape[-1]), dim=-1).indices
        candidates = self.lm_head[top].float()  # [N, k, hidden]
        # A plain row-wise sum, not bmm: its result must not depend on how many rows there are.
        exact = (candidates * hidden.float().unsqueeze(1)).sum(-1)
        return logits.scatter_(1, top, exact)
