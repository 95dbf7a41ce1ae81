"""A GGUF file's header: its metadata and its tensors' shapes and types, read with the standard
library (memory-mapped, the tensor data never read).

The ``gguf`` package's reader builds arrays for every tensor and vocabulary entry (2 s for the
135M default model); the planner needs only a few numbers. Layout (GGUF v2/v3, little-endian):
magic ``GGUF``, version u32, tensor count u64, metadata count u64, the metadata (key string,
value type u32, value), then per tensor: name, n_dims u32, dims u64 × n_dims, type u32, offset u64.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titan.errors import ConfigError

# GGUF metadata value types -> struct formats (8: string, 9: array are handled apart).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9

# ggml tensor types: id -> (name, values per block, bytes per block), from ggml.h.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}  # fmt: skip


@dataclass(frozen=True)
class GgufTensor:
    name: str
    shape: tuple[int, ...]
    type_name: str
    num_bytes: int

    @property
    def num_values(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class GgufHeader:
    version: int
    metadata: dict[str, Any]  # string arrays longer than 64 entries are kept as their length
    tensors: tuple[GgufTensor, ...]


class _Cursor:
    def __init__(self, data: mmap.mmap | bytes):
        self.data = data
        self.offset = 0

    def unpack(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.offset)[0]
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        raw = self.data[self.offset : self.offset + length]
        self.offset += length
        return bytes(raw).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        length = self.unpack("<Q")  # read first: it moves the offset past the length itself
        self.offset += length

    def value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            return self.array()
        return self.unpack(_SCALARS[value_type])

    def array(self) -> Any:
        item_type, count = self.unpack("<I"), self.unpack("<Q")
        if item_type == _STRING and count > 64:
            # A vocabulary or merge list: only its length matters here.
            for _ in range(count):
                self.skip_string()
            return count
        if item_type in _SCALARS and count > 64:
            self.offset += count * struct.calcsize(_SCALARS[item_type])
            return count
        return [self.value(item_type) for _ in range(count)]


def read_gguf_header(path: Path) -> GgufHeader:
    """Raises ConfigError when ``path`` is not a readable GGUF v2/v3 file."""
    try:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(_Cursor(data), path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the GGUF file: {exc.strerror or exc}") from None
    except (struct.error, KeyError, ValueError, IndexError):
        raise ConfigError(f"{path}: not a valid GGUF file (truncated or corrupt header)") from None


def _parse(cursor: _Cursor, path: Path) -> GgufHeader:
    if bytes(cursor.data[:4]) != b"GGUF":
        raise ConfigError(f"{path}: not a GGUF file (no GGUF magic)")
    cursor.offset = 4
    version = cursor.unpack("<I")
    if version not in (2, 3):
        raise ConfigError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    num_tensors, num_metadata = cursor.unpack("<Q"), cursor.unpack("<Q")
    metadata = {}
    for _ in range(num_metadata):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.unpack("<I"))
    tensors = []
    for _ in range(num_tensors):
        name = cursor.string()
        num_dims = cursor.unpack("<I")
        shape = tuple(cursor.unpack("<Q") for _ in range(num_dims))
        type_id = cursor.unpack("<I")
        cursor.unpack("<Q")  # offset into the data section
        type_name, block_values, block_bytes = GGML_TYPES[type_id]
        num_bytes = math.prod(shape) // block_values * block_bytes
        tensors.append(GgufTensor(name, shape, type_name, num_bytes))
    return GgufHeader(version, metadata, tuple(tensors))
