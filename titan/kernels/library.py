"""The compiled CPU kernels seen from Python (ctypes, which releases the GIL for each call): the
thread pool, quantized GEMMs, paged attention, the quantized model's forward step and a BERT
encoder's forward (the semantic cache's MiniLM).

The ctypes structures mirror cpu.h, forward.c and bert.c field for field.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from titan.kernels.packing import PackedWeight

_P = ctypes.c_void_p
_I64 = ctypes.c_int64


class QWeight(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int32), ("rows", _I64), ("cols", _I64), ("data", _P),
                ("bias", _P)]  # fmt: skip


class QActs(ctypes.Structure):
    _fields_ = [("qs", _P), ("d", _P), ("s", _P), ("cols", _I64)]


class AttentionArgs(ctypes.Structure):
    _fields_ = [
        ("q", _P), ("k_cache", _P), ("v_cache", _P), ("block_tables", _P),
        ("query_starts", _P), ("first_positions", _P), ("out", _P),
        ("num_seqs", _I64), ("num_heads", _I64), ("num_kv_heads", _I64), ("head_dim", _I64),
        ("block_size", _I64), ("max_blocks", _I64), ("q_stride", _I64), ("out_stride", _I64),
        ("scale", ctypes.c_float), ("dtype", ctypes.c_int32),
        ("kv_codes", _P),
    ]  # fmt: skip


class LayerWeights(ctypes.Structure):
    _fields_ = [
        ("input_norm", _P), ("qkv", QWeight), ("o_proj", QWeight), ("post_norm", _P),
        ("gate_up", QWeight), ("down", QWeight), ("k_cache", _P), ("v_cache", _P),
        ("kv_codes", _P),
    ]  # fmt: skip


class Model(ctypes.Structure):
    _fields_ = [
        ("hidden", _I64), ("intermediate", _I64), ("num_layers", _I64), ("num_heads", _I64),
        ("num_kv_heads", _I64), ("head_dim", _I64), ("block_size", _I64), ("vocab", _I64),
        ("eps", ctypes.c_float), ("layers", _P), ("final_norm", _P), ("lm_head", QWeight),
        ("embedding", QWeight), ("rope_cos", _P), ("rope_sin", _P),
        ("attention_dtype", ctypes.c_int32),
    ]  # fmt: skip


class BertLayer(ctypes.Structure):
    _fields_ = [
        ("qkv", QWeight), ("out", QWeight), ("norm1_weight", _P), ("norm1_bias", _P),
        ("up", QWeight), ("down", QWeight), ("norm2_weight", _P), ("norm2_bias", _P),
    ]  # fmt: skip


class BertModel(ctypes.Structure):
    _fields_ = [
        ("hidden", _I64), ("intermediate", _I64), ("num_layers", _I64), ("num_heads", _I64),
        ("max_positions", _I64), ("eps", ctypes.c_float), ("word", _P), ("position", _P),
        ("type", _P), ("norm_weight", _P), ("norm_bias", _P), ("layers", _P),
    ]  # fmt: skip


class BertBatch(ctypes.Structure):
    _fields_ = [("num_texts", _I64), ("starts", _P), ("token_ids", _P), ("type_ids", _P),
                ("output", ctypes.c_int32), ("out", _P)]  # fmt: skip


class KVMoveArgs(ctypes.Structure):
    _fields_ = [
        ("k_caches", _P), ("v_caches", _P), ("source_slots", _P), ("destination_slots", _P),
        ("num_layers", _I64), ("num_tokens", _I64), ("num_kv_heads", _I64), ("head_dim", _I64),
        ("block_size", _I64), ("cos", _P), ("sin", _P), ("kv_codes", _P),
    ]  # fmt: skip


class Step(ctypes.Structure):
    _fields_ = [
        ("num_tokens", _I64), ("token_ids", _P), ("positions", _P), ("slot_mapping", _P),
        ("num_seqs", _I64), ("max_blocks", _I64), ("block_tables", _P), ("query_starts", _P),
        ("first_positions", _P), ("num_logits", _I64), ("logit_rows", _P), ("logits", _P),
        ("seconds", _P),
    ]  # fmt: skip


KV_CODE_MAX_DIM = 256  # kv_codes.h: head dims with codes, a multiple of 16 up to this


def kv_code_words(head_dim: int) -> int:
    """32-bit words of the int8 units' codes (kv_codes.h) per token and KV head: for its key and
    again for its value, head_dim / 4 words of four int8 dims and one float scale."""
    return 2 * (head_dim // 4 + 1)


def kv_codes_shape(blocks: int, kv_heads: int, head_dim: int, block_size: int) -> tuple:
    """The int8 units' codes beside a KV cache (kv_codes.h), per block and KV head."""
    return (blocks, kv_heads, kv_code_words(head_dim), block_size)


ATTENTION_F32 = 0
ATTENTION_BF16 = 1
ATTENTION_F32_F16_CACHE = 2
ATTENTION_F32_F16_CACHE_REDUCED = 3  # attention_amx.c, _reduced.c or _avx2.c, where the CPU can


def pointer(array: np.ndarray | None) -> int | None:
    return None if array is None else array.ctypes.data


def qweight(packed: PackedWeight, bias: np.ndarray | None = None) -> QWeight:
    """The C view of a packed weight; the caller keeps ``packed`` (and ``bias``) alive."""
    return QWeight(packed.format, packed.rows, packed.cols, pointer(packed.data), pointer(bias))


class CpuKernels:
    """One loaded library and its thread pool of ``num_threads`` (the caller included)."""

    def __init__(self, library: Path, num_threads: int):
        self._lib = lib = ctypes.CDLL(str(library))
        lib.pool_create.argtypes, lib.pool_create.restype = [ctypes.c_int], _P
        lib.pool_destroy.argtypes, lib.pool_destroy.restype = [_P], None
        lib.qgemm_isa.argtypes, lib.qgemm_isa.restype = [], ctypes.c_char_p
        lib.qgemm.argtypes = [_P, ctypes.POINTER(QActs), _I64, ctypes.POINTER(QWeight), _P, _I64,
                              ctypes.c_int]  # fmt: skip
        lib.qgemm.restype = None
        lib.quantize_rows.argtypes = [_P, _I64, _I64, _P, _P, _P]
        lib.quantize_rows.restype = None
        lib.attention.argtypes = [_P, ctypes.POINTER(AttentionArgs)]
        lib.attention.restype = ctypes.c_int
        lib.attention_reduced_available.argtypes = []
        lib.attention_reduced_available.restype = ctypes.c_int
        lib.attention_reduced_kind.argtypes = []
        lib.attention_reduced_kind.restype = ctypes.c_char_p
        lib.kv_move.argtypes = [_P, ctypes.POINTER(KVMoveArgs)]
        lib.kv_move.restype = ctypes.c_int
        lib.kv_codes.argtypes = [_P, _P, _P, _I64, _I64, _I64, _I64, _P]
        lib.kv_codes.restype = ctypes.c_int
        lib.titan_forward.argtypes = [_P, ctypes.POINTER(Model), ctypes.POINTER(Step)]
        lib.titan_forward.restype = ctypes.c_int
        lib.bert_forward.argtypes = [_P, ctypes.POINTER(BertModel), ctypes.POINTER(BertBatch)]
        lib.bert_forward.restype = ctypes.c_int
        self.num_threads = num_threads
        self._pool = lib.pool_create(num_threads)
        if not self._pool:
            raise MemoryError("the CPU kernels could not create their thread pool")

    @property
    def isa(self) -> str:
        """The instruction set the GEMMs were compiled for: avx512-vnni, avx2, neon-dotprod or
        portable."""
        return self._lib.qgemm_isa().decode()

    @property
    def has_reduced_attention(self) -> bool:
        """Whether this build has a reduced-precision attention unit that this CPU lets run:
        attention_amx.c's (AMX-BF16), attention_reduced.c's (AVX-512 VNNI and BF16) or
        attention_avx2.c's (AVX2)."""
        return bool(self._lib.attention_reduced_available())

    @property
    def reads_kv_codes(self) -> bool:
        """Whether the reduced unit is an int8 one (attention_reduced.c, attention_avx2.c), which
        reads the KV cache's int8 codes (kv_codes.h) where the caller keeps them."""
        return self.reduced_attention_kind.startswith("int8")

    @property
    def reduced_attention_kind(self) -> str:
        """What that unit computes in, as the engine's log line says it."""
        kind = self._lib.attention_reduced_kind().decode()
        return kind if self.has_reduced_attention else "float32"

    def quantize(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows of float32 ``x`` as int8 blocks: (values, scales d, d * sums s)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows, cols = x.shape
        qs = np.empty((rows, cols), dtype=np.int8)
        d = np.empty((rows, cols // 32), dtype=np.float32)
        s = np.empty_like(d)
        self._lib.quantize_rows(pointer(x), rows, cols, pointer(qs), pointer(d), pointer(s))
        return qs, d, s

    def qgemm(self, x: np.ndarray, weight: PackedWeight, bias: np.ndarray | None = None):
        """float32 ``x @ weight.T (+ bias)``, x quantized per block of 32 first."""
        qs, d, s = self.quantize(x)
        out = np.empty((x.shape[0], weight.rows), dtype=np.float32)
        acts = QActs(pointer(qs), pointer(d), pointer(s), x.shape[1])
        view = qweight(weight, bias)
        self._lib.qgemm(self._pool, acts, x.shape[0], view, pointer(out), weight.rows, 0)
        return out

    def attention(self, args: AttentionArgs) -> None:
        status = self._lib.attention(self._pool, ctypes.byref(args))
        if status != 0:
            raise RuntimeError(f"the paged attention kernel failed ({status})")

    def kv_move(self, args: KVMoveArgs) -> None:
        status = self._lib.kv_move(self._pool, ctypes.byref(args))
        if status != 0:
            raise RuntimeError(f"the KV move kernel failed ({status})")

    def kv_codes(self, k_cache: np.ndarray, v_cache: np.ndarray, codes: np.ndarray) -> None:
        """Every key and value of float16 caches (K ``[blocks, kv_heads, head_dim, block_size]``,
        V ``[blocks, block_size, kv_heads, head_dim]``) as the int8 unit's codes, into ``codes``
        (int32, ``kv_codes_shape``)."""
        blocks, kv_heads, head_dim, block_size = k_cache.shape
        expected = kv_codes_shape(blocks, kv_heads, head_dim, block_size)
        if (
            k_cache.dtype != np.float16
            or v_cache.dtype != np.float16
            or v_cache.shape != (blocks, block_size, kv_heads, head_dim)
            or codes.dtype != np.int32
            or codes.shape != expected
        ):
            raise ValueError("KV codes need float16 K and V caches and int32 codes of their shape")
        if not all(a.flags.c_contiguous for a in (k_cache, v_cache, codes)):
            raise ValueError("KV codes need contiguous arrays")
        status = self._lib.kv_codes(self._pool, pointer(k_cache), pointer(v_cache), blocks,
                                    kv_heads, head_dim, block_size, pointer(codes))  # fmt: skip
        if status != 0:
            raise ValueError(
                f"no KV codes for head_dim {head_dim} (a multiple of 16 up to 256) and block_size "
                f"{block_size} (a multiple of 16)"
            )

    def forward(self, model: Model, step: Step) -> None:
        status = self._lib.titan_forward(self._pool, ctypes.byref(model), ctypes.byref(step))
        if status != 0:
            raise RuntimeError(f"the quantized forward step failed ({status})")

    def bert_forward(self, model: BertModel, batch: BertBatch) -> None:
        status = self._lib.bert_forward(self._pool, ctypes.byref(model), ctypes.byref(batch))
        if status != 0:
            raise RuntimeError(f"the BERT forward failed ({status})")

    def close(self) -> None:
        if self._pool:
            self._lib.pool_destroy(self._pool)
            self._pool = None
