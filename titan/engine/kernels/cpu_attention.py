"""Build and call the C paged-attention kernel (paged_attention.c) through ctypes.

The shared library is compiled once per machine (-march=native) into the cache directory, keyed
by the source's hash and the compiler. Without a C compiler the engine falls back to gathering
K/V and torch's SDPA: correct, slower on CPU, and not batch-invariant.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import logging
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("paged_attention.c")
# No fast-math: the kernel's summation order must be the one its code spells out. FMA
# contraction is on explicitly (ISO C mode turns it off); it applies the same way to every call.
_FLAGS = [
    "-O3",
    "-march=native",
    "-ffp-contract=fast",
    "-fno-math-errno",
    "-shared",
    "-fPIC",
    "-std=c11",
]
_ARGTYPES = [ctypes.c_void_p] * 7 + [ctypes.c_int64] * 7 + [ctypes.c_float]
_FUNCTIONS = {torch.float32: "paged_attention_f32", torch.bfloat16: "paged_attention_bf16"}


def build_library(cache_dir: Path) -> Path | None:
    """Compile the kernel if it is not cached yet; None when no C compiler works here."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler found: CPU attention uses the slower torch fallback")
        return None
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(source + compiler.encode() + " ".join(_FLAGS).encode()).hexdigest()[:16]
    target = cache_dir / f"paged_attention-{key}.so"
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as staging:
        built = Path(staging) / target.name
        result = subprocess.run(
            [compiler, *_FLAGS, "-o", str(built), str(_SOURCE), "-lm"],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            log.warning("building the CPU attention kernel failed:\n%s", result.stderr[-2000:])
            return None
        os.replace(built, target)
    return target


class CpuPagedAttention:
    """Attention for CPU tensors, sequences split over ``num_threads`` (ctypes drops the GIL)."""

    def __init__(self, library: Path, num_threads: int):
        lib = ctypes.CDLL(str(library))
        self._functions = {}
        for dtype, name in _FUNCTIONS.items():
            function = getattr(lib, name)
            function.argtypes = _ARGTYPES
            function.restype = ctypes.c_int
            self._functions[dtype] = function
        self.num_threads = num_threads
        self._pool = ThreadPoolExecutor(num_threads) if num_threads > 1 else None

    def supports(
        self, dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int
    ) -> bool:
        return (
            dtype in self._functions
            and block_size % 16 == 0
            and num_heads <= 128
            and num_heads % num_kv_heads == 0
            and head_dim <= 256
            and head_dim % 16 == 0
        )

    def __call__(
        self,
        q: torch.Tensor,  # [T, heads, head_dim], contiguous
        cache_k: torch.Tensor,  # [num_blocks, kv_heads, head_dim, block_size]
        cache_v: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
        block_tables: torch.Tensor,  # [S, max_blocks] int64
        query_starts: torch.Tensor,  # [S + 1] int64
        first_positions: torch.Tensor,  # [S] int64
        scale: float,
    ) -> torch.Tensor:
        _, num_heads, head_dim = q.shape
        _, block_size, num_kv_heads, _ = cache_v.shape
        num_seqs = first_positions.shape[0]
        out = torch.empty_like(q)
        function = self._functions[q.dtype]
        pointers = (
            q.data_ptr(),
            cache_k.data_ptr(),
            cache_v.data_ptr(),
            block_tables.data_ptr(),
            query_starts.data_ptr(),
            first_positions.data_ptr(),
            out.data_ptr(),
        )
        shape = (num_heads, num_kv_heads, head_dim, block_size, block_tables.shape[1], scale)

        def run(begin: int, end: int) -> None:
            if function(*pointers, begin, end, *shape) != 0:
                raise RuntimeError("the paged attention kernel rejected its arguments")

        if self._pool is None or num_seqs < 2:
            run(0, num_seqs)
        else:
            bounds = _balanced_bounds(query_starts, first_positions, self.num_threads)
            futures = [self._pool.submit(run, a, b) for a, b in itertools.pairwise(bounds) if b > a]
            for future in futures:
                future.result()
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def _balanced_bounds(
    query_starts: torch.Tensor, first_positions: torch.Tensor, num_parts: int
) -> list[int]:
    """Split sequences into contiguous ranges of roughly equal work (queries x context)."""
    starts = query_starts.tolist()
    firsts = first_positions.tolist()
    work = [
        (end - begin) * (first + (end - begin))
        for begin, end, first in zip(starts, starts[1:], firsts, strict=False)
    ]
    total = sum(work) or 1
    bounds, acc = [0], 0
    for index, cost in enumerate(work):
        acc += cost
        if acc >= total * len(bounds) / num_parts and len(bounds) < num_parts:
            bounds.append(index + 1)
    bounds.append(len(work))
    return bounds
