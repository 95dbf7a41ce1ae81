"""Built-in models: the published configs (each model's HF ``config.json``) of common open models.

The parameter counts the shapes give are checked against the published sizes in the tests.
"""

from __future__ import annotations

from titan.planning.models import MlaSpec, ModelSpec, MoeSpec

_LLAMA_31_CONTEXT = 131_072

BUILT_IN_MODELS: tuple[ModelSpec, ...] = (
    # meta-llama/Llama-3.1-8B: 8.03B
    ModelSpec("Llama-3.1-8B", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
              head_dim=128, intermediate_size=14336, vocab_size=128256,
              max_context=_LLAMA_31_CONTEXT),
    # meta-llama/Llama-3.1-70B: 70.6B
    ModelSpec("Llama-3.1-70B", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
              head_dim=128, intermediate_size=28672, vocab_size=128256,
              max_context=_LLAMA_31_CONTEXT),
    # Qwen/Qwen2.5-7B: 7.61B (Q/K/V biases)
    ModelSpec("Qwen2.5-7B", num_layers=28, hidden_size=3584, num_heads=28, num_kv_heads=4,
              head_dim=128, intermediate_size=18944, vocab_size=152064, max_context=32768,
              has_qkv_bias=True),
    # Qwen/Qwen2.5-72B: 72.7B
    ModelSpec("Qwen2.5-72B", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
              head_dim=128, intermediate_size=29568, vocab_size=152064, max_context=32768,
              has_qkv_bias=True),
    # mistralai/Mistral-7B-v0.3: 7.25B
    ModelSpec("Mistral-7B", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
              head_dim=128, intermediate_size=14336, vocab_size=32768, max_context=32768),
    # mistralai/Mixtral-8x7B-v0.1: 46.7B, 12.9B active (2 of 8 experts)
    ModelSpec("Mixtral-8x7B", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
              head_dim=128, intermediate_size=14336, vocab_size=32000, max_context=32768,
              moe=MoeSpec(num_experts=8, num_experts_per_token=2,
                          expert_intermediate_size=14336)),
    # deepseek-ai/DeepSeek-V3: 671B, 37B active (8 of 256 routed experts + 1 shared; the first
    # 3 layers dense), MLA; the 14B multi-token-prediction module is not counted.
    ModelSpec("DeepSeek-V3", num_layers=61, hidden_size=7168, num_heads=128, num_kv_heads=128,
              head_dim=192, intermediate_size=18432, vocab_size=129280, max_context=163840,
              moe=MoeSpec(num_experts=256, num_experts_per_token=8,
                          expert_intermediate_size=2048, num_shared_experts=1,
                          num_dense_layers=3),
              mla=MlaSpec(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                          v_head_dim=128, q_lora_rank=1536)),
    # HuggingFaceTB/SmolLM2-135M-Instruct: the embedded engine's default model, 134.5M
    ModelSpec("SmolLM2-135M", num_layers=30, hidden_size=576, num_heads=9, num_kv_heads=3,
              head_dim=64, intermediate_size=1536, vocab_size=49152, max_context=8192,
              tie_embeddings=True),
)  # fmt: skip


def _key(name: str) -> str:
    """Case, an ``org/`` prefix and an ``-Instruct`` suffix do not matter."""
    key = name.rsplit("/", 1)[-1].lower()
    return key.removesuffix("-instruct").removesuffix("-instruct-v0.1")


_BY_KEY = {_key(model.name): model for model in BUILT_IN_MODELS}
_ALIASES = {"mistral-7b-v0.3": "mistral-7b", "mixtral-8x7b-v0.1": "mixtral-8x7b",
            "meta-llama-3.1-8b": "llama-3.1-8b", "meta-llama-3.1-70b": "llama-3.1-70b",
            "smollm2-135m-instruct": "smollm2-135m"}  # fmt: skip


def built_in_model(name: str) -> ModelSpec | None:
    key = _key(name)
    return _BY_KEY.get(_ALIASES.get(key, key))
