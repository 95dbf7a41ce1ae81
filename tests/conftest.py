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


@pytest.fixture(scope="session")
def tiny_verifier_weights(tmp_path_factory: pytest.TempPathFactory):
    """Pair verifier weights trained in seconds (one epoch over 32 training pairs): the real
    format and serving path, not the real verifier's quality (bench/RESULTS.md measures that)."""
    from titan.cache.embedder import model_dir
    from titan.cache.pair_training import Training, trained_weights, training_pairs

    pairs = training_pairs()[:32]
    folder = tmp_path_factory.mktemp("pair-verifier")
    return trained_weights(folder, model_dir(), pairs, Training(epochs=1, batch_size=8))
