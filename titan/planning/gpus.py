"""Accelerators: memory, memory bandwidth and dense tensor throughput from the vendors' data
sheets (SXM variants where there are several; dense, i.e. without 2:4 sparsity), and a CPU
described by its cores.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 10**9
TERA = 10**12


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int
    memory_bandwidth: float  # bytes/s
    bf16_flops: float  # dense tensor FLOP/s in bf16/fp16 with fp32 accumulation
    fp8_flops: float | None  # None: no fp8 tensor cores (fp8 weights are dequantized to bf16)
    int8_ops: float | None = None
    is_cpu: bool = False
    note: str = ""

    def flops_for(self, compute_dtype: str) -> float:
        """Peak dense FLOP/s for matmuls in ``compute_dtype`` (bf16, fp8, int8 or fp32)."""
        if compute_dtype == "fp8" and self.fp8_flops:
            return self.fp8_flops
        if compute_dtype == "int8" and self.int8_ops:
            return self.int8_ops
        if compute_dtype == "fp32" and not self.is_cpu:
            return self.bf16_flops / 16  # no tensor cores for fp32 (tf32 aside)
        if compute_dtype == "fp32":
            return self.bf16_flops / 2
        return self.bf16_flops


GPUS: tuple[GpuSpec, ...] = (
    GpuSpec("H200", 141 * GB, 4.8e12, 989 * TERA, 1979 * TERA, 1979 * TERA, note="H200 SXM, HBM3e"),
    GpuSpec("H100", 80 * GB, 3.35e12, 989 * TERA, 1979 * TERA, 1979 * TERA, note="H100 SXM, HBM3"),
    GpuSpec(
        "A100-80G",
        80 * GB,
        2.039e12,
        312 * TERA,
        None,
        624 * TERA,
        note="A100 SXM 80GB, HBM2e; no fp8",
    ),
    GpuSpec("L40S", 48 * GB, 864 * GB, 362 * TERA, 733 * TERA, 733 * TERA, note="GDDR6"),
    GpuSpec(
        "A10G",
        24 * GB,
        600 * GB,
        70 * TERA,
        None,
        140 * TERA,
        note="AWS g5, GDDR6; the A10's 125 TFLOPS is not the A10G's",
    ),
    GpuSpec(
        "RTX-4090",
        24 * GB,
        1008 * GB,
        165 * TERA,
        330 * TERA,
        330 * TERA,
        note="GDDR6X; GeForce rates with fp32 accumulation",
    ),
)


def cpu_spec(
    num_cores: int,
    memory_bytes: int = 64 * 2**30,
    memory_bandwidth: float = 20 * GB,
    ghz: float = 2.5,
    bf16_flops_per_cycle: float = 64.0,
) -> GpuSpec:
    """A CPU as an accelerator: peak FLOP/s = cores × GHz × FLOP per cycle per core (64: one
    AVX-512 BF16 dot-product unit), and the memory bandwidth this process gets (a server socket
    has 100–300 GB/s; a small VM's share is far less). Measured numbers beat these defaults:
    ``python -m benchmarks planner`` calibrates the embedded engine on this machine."""
    if num_cores < 1:
        raise ValueError(f"a CPU needs at least one core, got {num_cores}")
    flops = num_cores * ghz * 1e9 * bf16_flops_per_cycle
    return GpuSpec(
        f"cpu ({num_cores} cores)",
        memory_bytes,
        memory_bandwidth,
        flops,
        None,
        None,
        is_cpu=True,
        note=f"{num_cores} cores at {ghz:g} GHz",
    )


_BY_KEY = {gpu.name.lower(): gpu for gpu in GPUS}
_ALIASES = {
    "h200-sxm": "h200",
    "h100-sxm": "h100",
    "h100-80g": "h100",
    "a100": "a100-80g",
    "a100-80gb": "a100-80g",
    "4090": "rtx-4090",
    "rtx4090": "rtx-4090",
    "rtx 4090": "rtx-4090",
}


def gpu_by_name(name: str, cpu_cores: int = 1) -> GpuSpec | None:
    """A table entry (case-insensitive), or ``cpu`` with ``cpu_cores`` cores."""
    key = name.strip().lower()
    if key == "cpu":
        return cpu_spec(cpu_cores)
    return _BY_KEY.get(_ALIASES.get(key, key))
