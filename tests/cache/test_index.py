"""The semantic cache's vector index: exact (numpy) and approximate (usearch) paths, the switch
between them, removal and scopes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from titan.cache.index import BRUTE_FORCE_LIMIT, ScopedIndex, VectorIndex
from titan.cache.response_cache import INDEX_PRECISION

DIM = 32


def clustered(count: int, seed: int = 0) -> np.ndarray:
    """Well-separated unit vectors (random directions in 32 dimensions): the approximate search
    finds the same nearest neighbour as the exact one, so the two paths can be compared."""
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((count, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def near(vector: np.ndarray, seed: int, noise: float = 0.05) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return vector + noise * rng.standard_normal(vector.shape).astype(np.float32)


def filled(count: int, limit: int) -> tuple[VectorIndex, np.ndarray]:
    index = VectorIndex(DIM, brute_force_limit=limit)
    vectors = clustered(count)
    for i, vector in enumerate(vectors):
        index.add(f"k{i}", vector)
    return index, vectors


def test_exact_search_orders_by_cosine():
    index = VectorIndex(3)
    index.add("x", [1, 0, 0])
    index.add("xy", [1, 1, 0])
    index.add("y", [0, 5, 0])  # not unit length: normalized on the way in
    results = index.search([2, 0.1, 0], k=3)
    assert [key for key, _ in results] == ["x", "xy", "y"]
    scores = [score for _, score in results]
    assert scores[0] == pytest.approx(0.99875, abs=1e-4)
    assert scores[1] == pytest.approx(np.cos(np.pi / 4 - np.arctan(0.05)), abs=1e-4)
    assert index.search([1, 0, 0], k=10)[0] == ("x", pytest.approx(1.0))
    assert len(index.search([1, 0, 0], k=10)) == 3
    assert index.search([1, 0, 0], k=0) == []
    assert VectorIndex(3).search([1, 0, 0], k=5) == []


def test_brute_force_and_usearch_agree_on_the_top_results():
    exact, vectors = filled(300, limit=10_000)
    approximate, _ = filled(300, limit=1)
    assert exact.exact and not approximate.exact
    for i in range(0, 300, 7):
        query = near(vectors[i], seed=i)
        top_exact = exact.search(query, k=3)
        top_approximate = approximate.search(query, k=3)
        assert top_exact[0][0] == top_approximate[0][0] == f"k{i}"
        # each similarity within the int8 graph's precision of the exact one, and none of the
        # three much further than the exact three (two nearly as close may swap places: the
        # cache judges candidates on their stored f32 vectors)
        unit = query / np.linalg.norm(query)
        for rank, (key, score) in enumerate(top_approximate):
            exact_score = float(
                vectors[int(key[1:])] @ unit / np.linalg.norm(vectors[int(key[1:])])
            )
            assert score == pytest.approx(exact_score, abs=INDEX_PRECISION)
            assert score >= top_exact[rank][1] - INDEX_PRECISION


@pytest.mark.parametrize("limit", [10_000, 1])
def test_replace_and_remove(limit):
    index, vectors = filled(50, limit)
    index.add("k3", vectors[40])  # replaced: k3 now points where k40 does
    assert len(index) == 50
    assert {key for key, _ in index.search(vectors[40], k=2)} == {"k3", "k40"}
    assert index.remove("k40") and not index.remove("k40") and not index.remove("nope")
    assert "k40" not in index and "k3" in index
    assert len(index) == 49
    assert index.search(vectors[40], k=1)[0][0] == "k3"
    for i in range(50):
        index.remove(f"k{i}")
    assert len(index) == 0 and index.search(vectors[0], k=3) == []


def test_the_switch_keeps_every_entry_both_ways():
    limit = 16
    index, vectors = filled(limit - 1, limit)
    assert index.exact
    index.add(f"k{limit - 1}", clustered(limit, seed=1)[-1])
    assert not index.exact and len(index) == limit
    for i in range(limit - 1):
        assert index.search(vectors[i], k=1)[0] == (
            f"k{i}",
            pytest.approx(1.0, abs=INDEX_PRECISION),
        )
    # Back to exact search below half the limit, not right under it (no rebuild on every call).
    index.remove("k0")
    assert not index.exact
    for i in range(1, limit // 2 + 1):
        index.remove(f"k{i}")
    assert index.exact and len(index) == limit // 2 - 1
    for i in range(limit // 2 + 1, limit - 1):  # vectors back from the half-precision graph
        assert index.search(vectors[i], k=1)[0] == (
            f"k{i}",
            pytest.approx(1.0, abs=INDEX_PRECISION),
        )


def test_add_many_switches_in_one_batch():
    index = VectorIndex(DIM, brute_force_limit=100)
    vectors = clustered(350)
    index.add_many([f"k{i}" for i in range(250)], vectors[:250])
    assert not index.exact and len(index) == 250
    assert index.search(vectors[123], k=1)[0][0] == "k123"
    # Into the graph: new keys, a replaced key, a key repeated within the batch.
    keys = [f"k{i}" for i in range(250, 350)] + ["k0", "k1", "k1"]
    index.add_many(keys, np.concatenate([vectors[250:], vectors[[300, 301, 302]]]))
    assert len(index) == 350
    assert {key for key, _ in index.search(vectors[300], k=2)} == {"k0", "k300"}
    assert {key for key, _ in index.search(vectors[302], k=3)}.issuperset({"k1", "k302"})
    assert index.search(vectors[301], k=1)[0][0] == "k301"


def test_bad_vectors_are_rejected():
    index = VectorIndex(3)
    with pytest.raises(ValueError, match="3 dimensions"):
        index.add("a", [1, 0])
    with pytest.raises(ValueError, match="zero"):
        index.add("a", [0, 0, 0])
    with pytest.raises(ValueError, match="zero or non-finite"):
        index.search([np.nan, 0, 0])
    with pytest.raises(ValueError):
        index.add_many(["a", "b"], [[1, 0, 0], [0, 0, 0]])
    assert len(index) == 0  # all or nothing


def test_scopes_are_isolated():
    scoped = ScopedIndex(DIM, brute_force_limit=8)
    vectors = clustered(30)
    for i in range(20):
        scoped.add("tenant-a", f"a{i}", vectors[i])
    for i in range(10):
        scoped.add("tenant-b", f"b{i}", vectors[i])  # the same vectors, another scope
    assert len(scoped) == 30
    assert scoped.search("tenant-a", vectors[3], k=1)[0][0] == "a3"
    assert scoped.search("tenant-b", vectors[3], k=1)[0][0] == "b3"
    assert all(key.startswith("b") for key, _ in scoped.search("tenant-b", vectors[15], k=10))
    assert scoped.search("tenant-c", vectors[3], k=1) == []
    scoped.add("tenant-a", "a3", vectors[3])  # replacing does not grow it
    assert len(scoped) == 30
    assert scoped.remove("tenant-b", "b3") and not scoped.remove("tenant-b", "b3")
    assert not scoped.remove("tenant-c", "a3") and not scoped.remove("tenant-b", "a4")
    assert len(scoped) == 29
    assert scoped.search("tenant-a", vectors[3], k=1)[0][0] == "a3"
    scoped.clear()
    assert len(scoped) == 0 and scoped.search("tenant-a", vectors[3], k=1) == []


def test_a_rejected_vector_leaves_no_empty_scope():
    scoped = ScopedIndex(3)
    with pytest.raises(ValueError):
        scoped.add("s", "k", [0, 0, 0])
    assert len(scoped) == 0
    scoped.add("s", "k", [1, 0, 0])
    assert scoped.remove("s", "k") and len(scoped) == 0
    assert scoped.search("s", [1, 0, 0]) == []


def test_importing_the_cache_does_not_import_usearch():

    code = "import sys, titan.cache.index, titan.cache.guards; print('usearch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
    assert BRUTE_FORCE_LIMIT == 4096
