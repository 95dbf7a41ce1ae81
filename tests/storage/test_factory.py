from __future__ import annotations

import subprocess
import sys

import pytest

from titan.errors import ConfigError
from titan.storage import open_storage
from titan.storage.memory import MemoryCounters, MemoryDocuments, MemoryLimits
from titan.storage.sqlite import SqliteCounters, SqliteDocuments


async def test_memory():
    storage = await open_storage("memory://", now=lambda: 5.0)
    assert isinstance(storage.documents, MemoryDocuments)
    assert isinstance(storage.counters, MemoryCounters)
    assert isinstance(storage.limits, MemoryLimits)
    assert (await storage.limits.acquire([])).now == 5.0
    await storage.close()


async def test_sqlite_with_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    storage = await open_storage("sqlite:///~/titan/titan.db")
    assert isinstance(storage.documents, SqliteDocuments)
    assert isinstance(storage.counters, SqliteCounters)
    assert isinstance(storage.limits, MemoryLimits)
    await storage.documents.put("ns", "a", {"x": 1})
    await storage.close()
    assert (tmp_path / "titan" / "titan.db").exists()


async def test_sqlite_absolute_path(tmp_path):
    storage = await open_storage(f"sqlite:///{tmp_path}/abs.db")  # four slashes: absolute
    await storage.close()
    assert (tmp_path / "abs.db").exists()


@pytest.mark.parametrize("url", ["postgres://db", "mysql://x", "nonsense", "sqlite://", ""])
async def test_unknown_urls_name_the_accepted_schemes(url):
    with pytest.raises(ConfigError, match="sqlite"):
        await open_storage(url)


def test_importing_storage_does_not_import_redis():
    code = "import sys, titan.storage; print('redis' in sys.modules)"
    run = [sys.executable, "-c", code]
    result = subprocess.run(run, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
