"""A newcomer's walk: every command block marked ``<!-- doc-run -->`` in README.md, then in
docs/*.md, runs as written and in order, in one shell, on a fresh copy of the checkout with a
private HOME and none of the tests' TITAN_* variables (see tests/docs/blocks.py for the markers).

The shell keeps what a reader's would between blocks (``cd``, ``export``, an activated venv) and
background blocks (``make serve``) serve until the walk ends. A block fails the walk when a
command in it fails or when it prints an OpenAI error body (curl exits 0 on a 401). The copy
shares this checkout's ``.venv`` (``make serve`` finds it up to date and installs nothing).
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT, Block, blocks, documents

pytestmark = pytest.mark.slow

WALK_TIMEOUT_S = 900
READY_TIMEOUT_S = 300
DOC_PORTS = (8000,)  # what the docs' commands talk to: the walk needs it free

# Fails the walk on the first command that fails, naming the block; background blocks are
# killed (their whole process group) when the walk ends, however it ends.
PRELUDE = r"""
set -eE -o pipefail
WHERE=start
OUT=/dev/null
background_pids=""
trap 'status=$?; cat "$OUT"; echo "DOC-WALK FAILED at $WHERE (exit $status)"; exit $status' ERR
trap 'for pid in $background_pids; do kill -TERM -- "-$pid" 2>/dev/null || true; done; wait' EXIT

run_block() {  # FILE WHERE: sourced in this shell, so that exports, cd and activate carry over
  WHERE=$2
  OUT="$1.out"
  echo "::: $WHERE"
  { source "$1"; } > "$OUT" 2>&1
  cat "$OUT"
  OUT=/dev/null
  if grep -Eq '"error": ?\{ ?"message"' "$1.out"; then
    echo "DOC-WALK FAILED at $WHERE: it printed an OpenAI error"
    exit 1
  fi
}

run_background() {  # FILE WHERE URL: start it, wait until URL answers 200
  WHERE=$2
  echo "::: $WHERE (background, until $3 answers)"
  setsid bash -c "source '$1'" > "$1.out" 2>&1 &
  local pid=$!
  background_pids="$background_pids $pid"
  for _ in $(seq 1 $((2 * READY_TIMEOUT_S))); do
    if curl -sf -o /dev/null "$3"; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.5
  done
  tail -n 40 "$1.out"
  echo "DOC-WALK FAILED at $WHERE: $3 never answered 200"
  exit 1
}
"""


def fresh_copy(destination: Path) -> Path:
    """What a clone of this checkout would hold (tracked and new files, not ignored ones),
    with this checkout's .venv; mtimes kept so that make sees the venv as up to date."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (item.decode() for item in listed)):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    (destination / ".venv").symlink_to(ROOT / ".venv")
    return destination


def walk_script(work: Path, walked: list[Block]) -> str:
    lines = [PRELUDE, f"READY_TIMEOUT_S={READY_TIMEOUT_S}"]
    for index, block in enumerate(walked):
        file = work / f"block{index:03d}.sh"
        file.write_text(block.body)
        where = shlex.quote(block.where)
        if block.ready_url:
            lines.append(f"run_background {file} {where} {shlex.quote(block.ready_url)}")
        else:
            lines.append(f"run_block {file} {where}")
    lines.append('echo "DOC-WALK DONE"')
    return "\n".join(lines) + "\n"


def is_port_free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_every_runnable_block_of_the_readme_and_docs_runs_as_written(tmp_path: Path):
    busy = [port for port in DOC_PORTS if not is_port_free(port)]
    assert not busy, f"the docs' commands use port(s) {busy}, which something already holds"
    up_to_date = subprocess.run(["make", "-q", "install"], cwd=ROOT, capture_output=True)
    assert up_to_date.returncode == 0, "run `make install` first: the walk shares this .venv"
    checkout = fresh_copy(tmp_path / "titan")
    home = tmp_path / "home"
    home.mkdir()
    walked = [b for path in documents() for b in blocks(path) if b.marker == "run"]
    script = tmp_path / "walk.sh"
    script.write_text(walk_script(tmp_path, walked))
    # A new user's shell: no virtualenv, none of the tests' settings, a home of its own.
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TITAN_", "XDG_", "VIRTUAL_ENV", "PYTEST", "OPENAI_"))
    }
    path = environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
    environ["PATH"] = os.pathsep.join(p for p in path if not p.startswith(str(ROOT)))
    environ.update(HOME=str(home), COLUMNS="120")
    run = subprocess.run(
        ["bash", str(script)],
        cwd=checkout,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=WALK_TIMEOUT_S,
    )
    assert run.returncode == 0 and "DOC-WALK DONE" in run.stdout, run.stdout[-6000:]
