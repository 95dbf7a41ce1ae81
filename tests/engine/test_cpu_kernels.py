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
from titan.kernels.library import CpuKernels, kv_codes_shape

# Builds the kernels for every target (and runs the ARM ones under qemu): minutes, so `make
# test` only, not `make check`.
pytestmark = pytest.mark.slow

# Each path this machine can run, with the CPU flags it needs: -march=haswell is the AVX2 path
# (attention_avx2.c's int8 unit), x86-64 the portable C, cooperlake AVX-512 VNNI and BF16 without
# AMX (attention_reduced.c's int8 unit, which an AMX CPU's native build replaces by
# attention_amx.c's).
TARGETS = {
    "native": set(),
    "haswell": {"avx2", "fma", "f16c"},
    "x86-64": set(),
    "cooperlake": {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"},
}


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
        if (march == "native" or (flags and "x86" in _arch())) and needs <= flags
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


def _f16_attention(
    kernels: CpuKernels, dtype: int, q, k_cache, v_cache, tables, starts, firsts, codes=None
):  # fmt: skip
    """attention.c over float16 caches (the quantized model's), float32 queries and output;
    ``codes``: the caches' KV codes for the int8 unit to read."""
    head_dim = q.shape[-1]
    return CpuPagedAttention(kernels)(
        q, k_cache, v_cache, tables, starts, firsts, head_dim**-0.5, dtype=dtype, kv_codes=codes
    )  # fmt: skip


def _outlier_caches(generator: torch.Generator, num_blocks: int, kv_heads: int, head_dim: int):
    """Float16 caches shaped like a real model's: a few key channels many times the others (what
    RoPE'd keys look like), so each key's int8 scale is set by its outliers."""
    k = torch.randn(num_blocks, kv_heads, head_dim, 16, generator=generator)
    k[:, :, :4] *= 8
    v = torch.randn(num_blocks, 16, kv_heads, head_dim, generator=generator)
    return k.half(), v.half()


# Relative error of a row's output against the float32 unit on _outlier_caches' keys: median and
# worst allowed, per unit (measured: AMX median 0.5%, worst 2.9%; int8 median 3.2%, worst 27%:
# int8's per-key scale is set by the outlier channels).
REDUCED_ERROR = {"bfloat16 on AMX tiles": (0.02, 0.1), "int8 scores, int8 values": (0.05, 0.5),
                 "int8 scores, int8 values (AVX2)": (0.05, 0.5)}  # fmt: skip


# SmolLM2-135M's attention; Llama-3-style GQA with 128 dims; plain multi-head
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (16, 2, 128), (4, 4, 64)])
def test_reduced_attention_is_close_to_float32_and_batch_invariant(
    kernels, heads, kv_heads, head_dim
):
    from titan.kernels.library import ATTENTION_F32_F16_CACHE, ATTENTION_F32_F16_CACHE_REDUCED

    units = {march: k for march, k in kernels.items() if k.has_reduced_attention}
    if not units:
        pytest.skip("this CPU has neither AMX nor AVX-512 VNNI and BF16: the float32 unit serves")
    generator = torch.Generator().manual_seed(11)
    k_cache, v_cache = _outlier_caches(generator, 40, kv_heads, head_dim)
    table = torch.randperm(40, generator=generator)[None]
    q = torch.randn(150, heads, head_dim, generator=generator)
    chunk_args = (table, torch.tensor([0, 150]), torch.tensor([450]))
    for march, library in units.items():
        # one chunk of 150 queries at positions 450..599, then rows of it alone and beside
        # another sequence: every row must come out the same bits, and the same again where the
        # int8 unit reads the caches' KV codes instead of rounding keys and values itself
        codes = torch.empty(kv_codes_shape(*k_cache.shape), dtype=torch.int32)
        library.kv_codes(k_cache.numpy(), v_cache.numpy(), codes.numpy())
        # past the context the engine's codes hold whatever the memory held: NaN scales there
        # (every key's and value's, rows head_dim / 4 and -1) must change nothing
        for position in range(600, 640):
            block, offset = table[0, position // 16], position % 16
            codes[block, :, head_dim // 4, offset] = codes[block, :, -1, offset] = 0x7FC00000

        def reduced_of(*args, library=library, codes=None):
            return _f16_attention(library, ATTENTION_F32_F16_CACHE_REDUCED, *args, codes=codes)

        reduced = reduced_of(q, k_cache, v_cache, *chunk_args)
        assert torch.equal(reduced_of(q, k_cache, v_cache, *chunk_args, codes=codes), reduced)
        for row in (0, 17, 70, 149):
            alone = reduced_of(q[row : row + 1].clone(), k_cache, v_cache, table,
                               torch.tensor([0, 1]), torch.tensor([450 + row]))  # fmt: skip
            beside = reduced_of(torch.cat([q[:40], q[row : row + 1]]), k_cache, v_cache,
                                torch.cat([table, table]), torch.tensor([0, 40, 41]),
                                torch.tensor([100, 450 + row]), codes=codes)  # fmt: skip
            assert torch.equal(alone[0], reduced[row]), (march, row)
            assert torch.equal(beside[40], reduced[row]), (march, row)
        # against the float32 unit: close, not equal
        exact = _f16_attention(library, ATTENTION_F32_F16_CACHE, q, k_cache, v_cache, *chunk_args)
        assert not torch.equal(exact, reduced), march
        relative = ((reduced - exact).norm(dim=-1) / exact.norm(dim=-1)).flatten()
        median, worst = REDUCED_ERROR[library.reduced_attention_kind]
        assert relative.median() < median and relative.max() < worst, (march,
                                                                      relative.median(),
                                                                      relative.max())  # fmt: skip


def test_kv_codes_are_the_same_on_every_path(kernels):
    """The int8 unit's KV codes (kv_codes.h: AVX-512 or AVX2 where they run, plain C elsewhere)
    round every key and value alike; ties (x.5) round to even, the instruction's way."""
    generator = torch.Generator().manual_seed(5)
    k_cache, v_cache = _outlier_caches(generator, 6, 3, 64)
    halves = torch.arange(64) - 31.5
    halves[-1] = 127  # the scale 1: every other dim is a tie
    k_cache[0, 0, :, 0] = v_cache[0, 0, 0] = halves
    k_cache[1, 1, :, 3] = v_cache[1, 3, 1] = 0  # a zero key and value: scale 0, every byte 0
    codes = {}
    for march, library in kernels.items():
        codes[march] = torch.empty(kv_codes_shape(*k_cache.shape), dtype=torch.int32)
        library.kv_codes(k_cache.numpy(), v_cache.numpy(), codes[march].numpy())
    reference = next(iter(codes.values()))
    for march, got in codes.items():
        assert torch.equal(got, reference), march
    key_rows = 64 // 4  # kv_codes_shape's rows: the keys' lanes, their scales, then the values'
    assert (reference[1, 1, :key_rows, 3] == 0x80808080 - 2**32).all()
    assert reference[1, 1, key_rows, 3] == 0

    def rounded(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [..., dims]
        scale = x.abs().amax(-1, keepdim=True) * torch.tensor(1 / 127)  # kv_codes.h's float
        return torch.round(x / torch.where(scale > 0, scale, 1)).to(torch.int32), scale[..., 0]

    def unpacked(lanes: torch.Tensor) -> torch.Tensor:  # a lane's four bytes, low first
        return torch.stack([(lanes >> 8 * i) & 255 for i in range(4)], dim=-1)

    keys, key_scales = rounded(k_cache.float().permute(0, 1, 3, 2))  # [blocks, heads, keys, dims]
    lanes = reference[:, :, :key_rows].permute(0, 1, 3, 2)  # [blocks, heads, keys, dims / 4]
    assert (unpacked(lanes).flatten(-2) - 128 - keys).abs().max() <= 1  # x * (127 / max) only
    assert (unpacked(lanes[0, 0, 0]).flatten() - 128 == keys[0, 0, 0]).all()  # ties to even
    assert torch.equal(reference[:, :, key_rows].view(torch.float32), key_scales)
    values, value_scales = rounded(v_cache.float().permute(0, 2, 1, 3))  # [.., values, dims]
    flat = reference[:, :, key_rows + 1 :].flatten(2)  # [blocks, heads, (16 / 4) * 64 + 16]
    value_lanes = flat[:, :, : 4 * 64].reshape(6, 3, 4, 64)  # [.., values / 4, dims]
    signed = unpacked(value_lanes).permute(0, 1, 2, 4, 3).reshape(6, 3, 16, 64)
    signed = torch.where(signed > 127, signed - 256, signed)
    assert (signed - values).abs().max() <= 1
    assert (signed[0, 0, 0] == values[0, 0, 0]).all()  # ties to even, as torch.round
    assert (signed[1, 1, 3] == 0).all()
    assert torch.equal(flat[:, :, 4 * 64 :].view(torch.float32), value_scales)


def test_reduced_attention_falls_back_to_float32_where_the_cpu_lacks_it(kernels):
    """Builds without a reduced unit (portable C) serve the reduced dtype with the float32
    unit: the same bits as asking for it."""
    from titan.kernels.library import ATTENTION_F32_F16_CACHE, ATTENTION_F32_F16_CACHE_REDUCED

    generator = torch.Generator().manual_seed(12)
    k_cache, v_cache = _outlier_caches(generator, 8, 2, 64)
    args = (torch.arange(8)[None], torch.tensor([0, 40]), torch.tensor([60]))
    q = torch.randn(40, 4, 64, generator=generator)
    without = {march: k for march, k in kernels.items() if not k.has_reduced_attention}
    assert "x86-64" in without or "x86" not in _arch()
    for march, library in without.items():
        assert library.reduced_attention_kind == "float32", march
        exact = _f16_attention(library, ATTENTION_F32_F16_CACHE, q, k_cache, v_cache, *args)
        asked = _f16_attention(library, ATTENTION_F32_F16_CACHE_REDUCED, q, k_cache, v_cache,
                               *args)  # fmt: skip
        assert torch.equal(exact, asked), march


def test_kv_move_copies_values_and_rotates_keys_back_as_rope_does(kernels):
    """kv_move.c (context shift on the quantized model's caches) against rope.rotated_back, the
    torch path's computation: values copied exactly, keys the same up to float16 rounding."""
    import ctypes

    from titan.engine.model.rope import rotated_back, rotation_back
    from titan.kernels.library import KVMoveArgs, pointer

    layers, kv_heads, head_dim, size = 3, 2, 64, 16
    generator = torch.Generator().manual_seed(13)
    caches = [_outlier_caches(generator, 12, kv_heads, head_dim) for _ in range(layers)]
    before = [(k.clone(), v.clone()) for k, v in caches]
    source = np.arange(37, 37 + 70, dtype=np.int64)  # two blocks' worth, unaligned
    destination = np.arange(112, 112 + 70, dtype=np.int64)
    shift = 29
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    cos, sin = (x.numpy() for x in rotation_back(shift, inv_freq))
    pointers = ctypes.c_void_p * layers
    k_pointers = pointers(*(k.data_ptr() for k, _ in caches))
    v_pointers = pointers(*(v.data_ptr() for _, v in caches))
    kernels["native"].kv_move(KVMoveArgs(
        k_caches=ctypes.addressof(k_pointers), v_caches=ctypes.addressof(v_pointers),
        source_slots=pointer(source), destination_slots=pointer(destination), num_layers=layers,
        num_tokens=len(source), num_kv_heads=kv_heads, head_dim=head_dim, block_size=size,
        cos=pointer(cos), sin=pointer(sin),
    ))  # fmt: skip
    src, dst = torch.from_numpy(source), torch.from_numpy(destination)
    for (k, v), (k0, v0) in zip(caches, before, strict=True):
        flat_v, flat_v0 = v.view(-1, kv_heads, head_dim), v0.view(-1, kv_heads, head_dim)
        assert torch.equal(flat_v[dst], flat_v0[src])
        expected = rotated_back(k0[src // size, :, :, src % size], shift, inv_freq)
        moved = k[dst // size, :, :, dst % size]
        # C may fuse a multiply-add that torch rounds twice: at most one float16 step apart
        assert torch.allclose(moved.float(), expected.float(), rtol=2**-10, atol=2**-14)
        assert (moved == expected).float().mean() > 0.99
        untouched = torch.ones(12 * size, dtype=torch.bool)
        untouched[dst] = False
        assert torch.equal(flat_v[untouched], flat_v0[untouched])
