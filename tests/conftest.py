"""Every Titan a test starts keeps its state in memory unless the test says otherwise: no test
reads or writes the default SQLite file under the home directory (where keys would turn auth on)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.clock import ManualClock


@pytest.fixture(autouse=True, scope="session")
def _memory_storage() -> Iterator[None]:
    previous = os.environ.get("TITAN_STORAGE")
    os.environ["TITAN_STORAGE"] = "memory://"  # child processes (titan serve) inherit it
    yield
    if previous is None:
        os.environ.pop("TITAN_STORAGE", None)
    else:
        os.environ["TITAN_STORAGE"] = previous


@pytest.fixture
def clock() -> ManualClock:
    """A fake clock at t = 1,000 s (tests/clock.py)."""
    return ManualClock()
