"""Every instruction-set path of the CPU kernels, built here and, for ARM, run under emulation
(qemu-user with the aarch64 cross compiler; `make test` installs both): quantizing and the GEMMs
give the same bits on each (the AVX512-VNNI, AVX2, NEON dot-product and portable paths spell out
the same float operations with explicit FMAs); attention, written with vector extensions whose
multiply-adds each compiler fuses its own way, the same values to float rounding (its bits are
the same within one build, whatever the batch or the threads: test_cpu_kernels.py)."""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.engine.test_cpu_kernels import cpu_flags
from titan.kernels.build import _FLAGS, build_library, compiler

# Builds the kernels for every target (and runs the ARM ones under qemu): minutes, so `make
# test` only, not `make check`.
pytestmark = pytest.mark.slow

HARNESS = Path(__file__).parent / "kernels" / "kernel_hash.c"
KERNELS = Path(__file__).resolve().parents[2] / "titan" / "kernels"
ARM_GCC, QEMU, ARM_SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64", "/usr/aarch64-linux-gnu"
ARM_TARGETS = ("armv8.2-a+dotprod", "armv8-a")  # the NEON dot-product path, the portable one


def run_harness(
    cache: Path, cc: str, march: str, binary: Path, runner: list[str]
) -> dict[str, str]:
    """The harness linked against the kernels' shared library as the engine builds it for
    ``march`` (cached with the engine's own builds), run; its ``key value`` lines."""
    library = build_library(cache, march, cc)
    assert library is not None, f"the kernels did not build for -march={march} with {cc}"
    flags = [flag for flag in _FLAGS if flag not in ("-shared", "-fPIC")]
    command = [cc, *flags, f"-march={march}", f"-I{KERNELS}", str(HARNESS), str(library), "-lm"]
    command += [f"-Wl,-rpath,{library.parent}", "-o", str(binary)]
    subprocess.run(command, check=True, capture_output=True)
    done = subprocess.run([*runner, str(binary)], check=True, capture_output=True, text=True)
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())


def x86_targets() -> list[str]:
    flags = cpu_flags()
    targets = ["x86-64"] if "sse2" in flags else []  # the portable path
    if {"avx2", "fma", "f16c"} <= flags:
        targets.append("haswell")
    if {"avx512f", "avx512bw", "avx512_vnni"} <= flags:
        targets.append("icelake-server")
    return targets


def test_every_path_computes_the_same_bits(tmp_path: Path, kernel_cache: Path):
    cc = compiler()
    assert cc is not None
    builds = {target: (cc, target, []) for target in ["native", *x86_targets()]}
    has_arm = shutil.which(ARM_GCC) is not None and shutil.which(QEMU) is not None
    if has_arm:
        for target in ARM_TARGETS:
            builds[target] = (ARM_GCC, target, [QEMU, "-L", ARM_SYSROOT])

    def build_and_run(name: str) -> dict[str, str]:
        compiler_, march, runner = builds[name]
        binary = tmp_path / name.replace("+", "-")
        return run_harness(kernel_cache, compiler_, march, binary, runner)

    with ThreadPoolExecutor() as pool:  # the builds run side by side
        futures = {name: pool.submit(build_and_run, name) for name in builds}
        runs = {name: future.result() for name, future in futures.items()}
    reference = runs["native"]
    for name, run in runs.items():
        assert run["attention-status"] == "0", name
        for key in ("quantize", "qgemm-q4_1", "qgemm-q8_0"):
            assert run[key] == reference[key], (name, key)
        total = float(run["attention-sum"])
        assert total == pytest.approx(float(reference["attention-sum"]), rel=1e-6), name
    paths = {name: run["path"] for name, run in runs.items()}
    if not has_arm:
        pytest.skip(f"checked {paths}; no {ARM_GCC} and {QEMU} here for the ARM paths")
    assert {"neon-dotprod", "portable"} <= set(paths.values()), paths
