"""The C kernels (titan/kernels): quantized GEMMs exact to their integer arithmetic, the
same bits on every instruction-set path, for any batch and any thread count; attention spread
over threads gives the bits one thread gives."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from titan.engine.cpu_attention import CpuPagedAttention
from titan.kernels import packing
from titan.kernels.build import build_library
from titan.kernels.library import CpuKernels

# Builds the kernels for every target (and runs the ARM ones under qemu): minutes, so `make
# test` only, not `make check`.
pytestmark = pytest.mark.slow

# Each path this machine can run: -march=haswell is the AVX2 path, x86-64 the portable C.
TARGETS = {"native": None, "haswell": "avx2", "x86-64": None}


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((row for row in text.splitlines() if row.startswith(("flags", "Features"))), "")
    return set(line.split(":", 1)[-1].split())


@pytest.fixture(scope="module")
def kernels(kernel_cache: Path) -> dict[str, CpuKernels]:
    flags = cpu_flags()
    targets = [
        march
        for march, needs in TARGETS.items()
        if (march == "native" or (flags and "x86" in _arch()))
        and (needs != "avx2" or {"avx2", "fma", "f16c"} <= flags)
    ]
    with ThreadPoolExecutor() as pool:  # the compilers run side by side
        futures = {march: pool.submit(build_library, kernel_cache, march) for march in targets}
        libraries = {march: future.result() for march, future in futures.items()}
    built = {}
    for march, library in libraries.items():
        assert library is not None, f"the kernels did not build for -march={march}"
        built[march] = CpuKernels(library, 2)
    yield built
    for kernel in built.values():
        kernel.close()


def _arch() -> str:
    import platform

    return platform.machine().replace("_", "")


def q4_1_blocks(weights: np.ndarray) -> np.ndarray:
    """GGUF Q4_1 blocks of float weights (min/max per block), as llama.cpp quantizes them."""
    rows, cols = weights.shape
    values = weights.reshape(rows, cols // 32, 32)
    low, high = values.min(-1), values.max(-1)
    scale = (high - low) / 15
    q = np.clip(np.rint((values - low[..., None]) / scale[..., None]), 0, 15).astype(np.uint8)
    blocks = np.zeros((rows, cols // 32, 20), np.uint8)
    blocks[:, :, 0:2] = scale.astype(np.float16).reshape(rows, -1, 1).view(np.uint8)
    blocks[:, :, 2:4] = low.astype(np.float16).reshape(rows, -1, 1).view(np.uint8)
    blocks[:, :, 4:20] = q[:, :, :16] | (q[:, :, 16:] << 4)
    return blocks


def weights_of_both_formats(rows: int, cols: int) -> dict[str, tuple[np.ndarray, int]]:
    dense = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32)
    return {
        "Q4_1": (q4_1_blocks(dense), packing.Q4_1),
        "Q8_0": (packing.quantize_q8_0(dense), packing.Q8_0),
    }


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
def test_gemm_is_exact_to_its_integer_arithmetic_and_close_to_float(kernels, fmt):
    blocks, code = weights_of_both_formats(77, 576)[fmt]  # 77 rows: a partial panel
    packed = packing.pack_gguf(blocks, code)
    x = np.random.default_rng(2).standard_normal((9, 576)).astype(np.float32)
    native = kernels["native"]
    out = native.qgemm(x, packed)
    dense = packing.dequantize(blocks, code)
    qs, d, _ = native.quantize(x)
    x_quantized = (qs.reshape(9, -1, 32) * d[..., None]).reshape(9, 576).astype(np.float64)
    exact = x_quantized @ dense.T.astype(np.float64)
    assert np.abs(out - exact).max() <= 1e-5 * np.abs(exact).max()
    relative = np.abs(out - x @ dense.T).max() / np.abs(x @ dense.T).max()
    assert relative < 0.02  # int8 activations: about 0.5% here
    bias = np.arange(77, dtype=np.float32)
    assert np.array_equal(native.qgemm(x, packed, bias), out + bias)


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
def test_every_path_gives_the_same_bits_for_any_batch(kernels, fmt):
    blocks, code = weights_of_both_formats(200, 1536)[fmt]
    packed = packing.pack_gguf(blocks, code)
    x = np.random.default_rng(3).standard_normal((70, 1536)).astype(np.float32)
    outputs = {march: kernel.qgemm(x, packed) for march, kernel in kernels.items()}
    reference = outputs["native"]
    assert all(np.array_equal(reference, other) for other in outputs.values()), list(outputs)
    native = kernels["native"]
    for rows in (slice(0, 1), slice(5, 8), slice(3, 68)):  # other batch sizes, other tiles
        assert np.array_equal(native.qgemm(x[rows], packed), reference[rows])


def test_one_thread_gives_the_bits_of_many(kernels):
    blocks, code = weights_of_both_formats(300, 576)["Q4_1"]
    packed = packing.pack_gguf(blocks, code)
    x = np.random.default_rng(4).standard_normal((33, 576)).astype(np.float32)
    one = CpuKernels(build_library(Path(kernels["native"]._lib._name).parent), 1)
    try:
        assert np.array_equal(one.qgemm(x, packed), kernels["native"].qgemm(x, packed))
    finally:
        one.close()


def test_packing_keeps_every_value(kernels):
    for fmt, (blocks, code) in weights_of_both_formats(35, 64).items():
        packed = packing.pack_gguf(blocks, code)
        assert packed.data.shape == (3, 2, packing.PANEL_BLOCK_BYTES[code]), fmt
        identity = np.eye(64, dtype=np.float32) * 127  # one value per block, exactly int8
        through_gemm = kernels["native"].qgemm(identity, packed).T / 127
        dense = packing.dequantize(blocks, code)
        assert np.allclose(through_gemm, dense, rtol=1e-6, atol=1e-6), fmt


def test_attention_over_threads_equals_one_thread(kernels):
    heads, kv_heads, head_dim, block_size, num_blocks = 6, 2, 64, 16, 40
    generator = torch.Generator().manual_seed(5)
    k_cache = torch.randn(num_blocks, kv_heads, head_dim, block_size, generator=generator)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=generator)
    # three sequences: a decode at 200 tokens, a 70-token chunk after 100, a fresh 40-token one
    query_starts = torch.tensor([0, 1, 71, 111])
    first_positions = torch.tensor([199, 100, 0])
    padded = [list(range(0, 13)), [*range(13, 25), 0], [*range(25, 28)] + [0] * 10]
    tables = torch.tensor(padded)
    q = torch.randn(111, heads, head_dim, generator=generator)
    native = kernels["native"]
    one = CpuKernels(build_library(Path(native._lib._name).parent), 1)
    try:
        args = (q, k_cache, v_cache, tables, query_starts, first_positions, 0.125)
        many = CpuPagedAttention(native)(*args)
        single = CpuPagedAttention(one)(*args)
    finally:
        one.close()
    assert torch.equal(many, single)
    # and the decode row is the plain softmax attention over its 200 tokens
    keys = k_cache[tables[0]].permute(1, 0, 3, 2).reshape(kv_heads, -1, head_dim)[:, :200]
    values = v_cache[tables[0]].permute(2, 0, 1, 3).reshape(kv_heads, -1, head_dim)[:, :200]
    query = q[0].view(kv_heads, heads // kv_heads, head_dim)
    weights = torch.softmax(query @ keys.transpose(1, 2) * 0.125, dim=-1)
    expected = (weights @ values).reshape(heads, head_dim)
    assert torch.allclose(many[0], expected, atol=1e-5)
