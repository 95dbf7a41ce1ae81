"""Build Titan's CPU kernels (the C files beside this module) into one shared library, once per
machine: ``cc -O3 -march=native``, cached in the cache directory under a key of the sources, the
compiler, the flags and the target. -march=native is the dispatch: the compiler emits the best
instructions this CPU has (AVX-512 VNNI, AVX2, NEON dot product) and the code picks its paths
from the same macros; a CPU with none of them gets the portable C paths, slower but exact.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
SOURCES = (
    "threads.c",
    "quant.c",
    "qgemm.c",
    "attention.c",
    "attention_reduced.c",
    "attention_amx.c",
    "attention_avx2.c",
    "kv_move.c",
    "forward.c",
    "bert.c",
)
HEADERS = ("cpu.h", "vec.h", "vec_keys.h", "attention.h", "kv_codes.h")
# No fast-math: the kernels' summation orders must be the ones the code spells out. FMA
# contraction is on explicitly (ISO C mode turns it off); it applies the same way to every call.
_FLAGS = [
    "-O3",
    "-ffp-contract=fast",
    "-fno-math-errno",
    "-shared",
    "-fPIC",
    "-std=gnu11",
    "-pthread",
    "-Wno-psabi",
]


def default_cache_dir() -> Path:
    """Where the kernels are cached unless the engine's ``cache_dir`` says otherwise."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "titan" / "kernels"


def compiler() -> str | None:
    """The C compiler: $CC, else cc, else gcc."""
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def build_library(cache_dir: Path, march: str = "native", cc: str | None = None) -> Path | None:
    """The compiled library, built now if not cached; None when no C compiler works here.

    ``march`` other than ``native`` builds for another target, ``cc`` with another compiler
    (tests build the AVX2 and portable paths, and the ARM ones with a cross compiler)."""
    cc = cc or compiler()
    if cc is None:
        log.warning("no C compiler found: the CPU kernels are off (torch's slower paths serve)")
        return None
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        digest.update((_HERE / name).read_bytes())
    digest.update(" ".join([cc, *_FLAGS, march]).encode())
    target = cache_dir / f"titan_cpu-{march}-{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as staging:
        built = Path(staging) / target.name
        command = [cc, *_FLAGS, f"-march={march}", "-o", str(built)]
        command += [str(_HERE / name) for name in SOURCES] + ["-lm"]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            log.warning("building the CPU kernels failed:\n%s", result.stderr[-2000:])
            return None
        os.replace(built, target)
    return target
