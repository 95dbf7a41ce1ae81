"""llama.cpp's ``llama-server``, the baseline a local-model user runs instead (Ollama and LM Studio
wrap it), built in the benchmark's own environment from the llama.cpp sources inside the
llama-cpp-python sdist from the package registry, once, and cached.

Building takes about 15 minutes on 2 cores. Nothing of it goes into Titan's install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from titan.chaos.processes import Service, Services, free_port

LLAMA_CPP_PYTHON = "0.3.36"
START_TIMEOUT_S = 120.0


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "titan-bench" / f"llama.cpp-{LLAMA_CPP_PYTHON}"


def _has_amx() -> bool:
    try:
        return " amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


# ggml 0.3.36's AMX matmul dies at its first tile configuration on a Sapphire Rapids Xeon
# (SIGSEGV at `ldtilecfg` in ggml_backend_amx_mul_mat, 2026-12-04): on AMX CPUs the baseline is
# built without it, keeping -march=native's AVX-512 VNNI kernels, as llama.cpp runs elsewhere.
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def llama_server_binary(log: object = print) -> Path:
    """The cached binary, built first when missing (``-DGGML_NATIVE=ON``: for this CPU; without
    AMX where the CPU has it, see _NO_AMX)."""
    root = cache_root()
    no_amx = _has_amx()
    build = root / ("build-no-amx" if no_amx else "build")
    binary = build / "bin" / "llama-server"
    if binary.exists():
        return binary
    say = log if callable(log) else print
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as download:
        say(f"building llama-server from llama-cpp-python=={LLAMA_CPP_PYTHON}'s sources (~15 min)")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
             f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", download],
            check=True, capture_output=True,
        )  # fmt: skip
        (sdist,) = Path(download).glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(sdist) as archive:
            archive.extractall(download, filter="data")
        sources = next(Path(download).glob("llama_cpp_python-*/vendor/llama.cpp"))
        if (root / "src").exists():
            shutil.rmtree(root / "src")
        shutil.copytree(sources, root / "src")
    flags = [f"-DCMAKE_C_FLAGS={_NO_AMX}", f"-DCMAKE_CXX_FLAGS={_NO_AMX}"] if no_amx else []
    subprocess.run(
        ["cmake", "-S", str(root / "src"), "-B", str(build), "-DGGML_NATIVE=ON",
         "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release", *flags],
        check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(
        ["cmake", "--build", str(build), "--target", "llama-server",
         "-j", str(os.cpu_count() or 1)],
        check=True, capture_output=True,
    )  # fmt: skip
    return binary


def llama_server_version(binary: Path) -> str:
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return next((line for line in lines if line.startswith("version")), "unknown")


def start_llama_server(
    services: Services,
    binary: Path,
    gguf: Path,
    log_dir: Path,
    *,
    num_slots: int,
    context: int,
    threads: int,
) -> Service:
    """``llama-server -m GGUF -np N -cb -t THREADS -c CONTEXT -kvu``: N slots of continuous
    batching sharing one KV pool (so one long conversation may use all of it)."""
    port = free_port()
    argv = [
        str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "-np", str(num_slots), "-cb", "-t", str(threads), "-c", str(context), "-kvu",
        "--no-webui",
    ]  # fmt: skip
    return services.start(  # stopped with the others, however the run ends
        "llama-server", argv, f"http://127.0.0.1:{port}", log_dir,
        ready_path="/health", timeout_s=START_TIMEOUT_S,
    )  # fmt: skip
