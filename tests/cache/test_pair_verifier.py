"""The pair verifier (titan/cache/pair_verifier.py) and its training (pair_training.py): the
weights are cached under a hash of what they depend on, the quantized cross-encoder reads a
pair as torch's float model does, and the embedder prepares it in the background."""

from __future__ import annotations

import numpy as np
import pytest

from titan.cache.embedder import Embedder, model_dir
from titan.cache.pair_training import (
    TRAINING_DIR,
    Training,
    fingerprint,
    trained_weights,
    training_pairs,
)
from titan.cache.pair_verifier import PairVerifier
from titan.kernels.build import build_library, default_cache_dir
from titan.kernels.library import CpuKernels

pytestmark = pytest.mark.slow  # loads the embedding model and trains for seconds


def kernels() -> CpuKernels:
    library = build_library(default_cache_dir())
    if library is None:
        pytest.fail("the CPU kernels did not build here (a C compiler is needed)")
    return CpuKernels(library, 1)


def test_the_training_pairs_are_labeled_and_never_a_held_out_set():
    pairs = training_pairs()
    assert len(pairs) >= 1900
    assert {type(pair["should_hit"]) for pair in pairs} == {bool}
    assert all(set(pair) >= {"cached", "query", "should_hit"} for pair in pairs)
    assert 0.3 < np.mean([pair["should_hit"] for pair in pairs]) < 0.6
    assert not any("heldout" in path.name for path in TRAINING_DIR.glob("*.jsonl"))


def test_the_weights_name_changes_with_the_pairs_and_the_recipe():
    pairs = training_pairs()[:10]
    base = fingerprint(pairs, Training(), model_dir())
    assert fingerprint(pairs, Training(), model_dir()) == base
    assert fingerprint(pairs[:9], Training(), model_dir()) != base
    flipped = [{**pairs[0], "should_hit": not pairs[0]["should_hit"]}, *pairs[1:]]
    assert fingerprint(flipped, Training(), model_dir()) != base
    assert fingerprint(pairs, Training(epochs=2), model_dir()) != base


def test_trained_weights_are_reused_not_trained_again(tiny_verifier_weights, monkeypatch):
    from titan.cache import pair_training

    monkeypatch.setattr(pair_training, "train", lambda *args, **kwargs: pytest.fail("retrained"))
    pairs = training_pairs()[:32]
    again = trained_weights(
        tiny_verifier_weights.parent, model_dir(), pairs, Training(epochs=1, batch_size=8)
    )
    assert again == tiny_verifier_weights


def test_the_quantized_cross_encoder_reads_a_pair_as_the_float_model_does(tiny_verifier_weights):
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoModel, AutoTokenizer

    verifier = PairVerifier.load(model_dir(), tiny_verifier_weights, kernels())
    pairs = [(p["cached"], p["query"]) for p in training_pairs()[40:56]]
    weights = load_file(str(tiny_verifier_weights))
    bert = AutoModel.from_pretrained(str(model_dir()))
    bert.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()
                          if not k.startswith("classifier")}, strict=False)  # fmt: skip
    bert.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir()))
    with torch.no_grad():
        encoded = tokenizer(*map(list, zip(*pairs, strict=True)), padding=True, return_tensors="pt")
        exact = bert(**encoded).last_hidden_state[:, 0].numpy()
    # The [CLS] states: the second question's tokens are of type 1, its positions follow on.
    states = verifier._model.pair_states(pairs)
    cosines = (
        (states * exact).sum(1) / np.linalg.norm(states, axis=1) / np.linalg.norm(exact, axis=1)
    )
    assert cosines.min() > 0.9993  # 0.99964 here; with the types ignored 0.99865
    logits = exact @ weights["classifier.weight"] + weights["classifier.bias"][0]
    quantized = np.array(verifier.probabilities(pairs))
    assert np.abs(quantized - 1 / (1 + np.exp(-logits))).max() < 0.03
    # One pair alone scores as in a batch: each pair's rows are its own.
    assert verifier.probabilities(pairs[3:4])[0] == pytest.approx(quantized[3], abs=1e-6)


def test_one_pair_reads_its_second_order_only_when_the_first_reaches_the_threshold(
    tiny_verifier_weights, monkeypatch
):
    from titan.cache import pair_verifier

    verifier = PairVerifier.load(model_dir(), tiny_verifier_weights, kernels())
    pairs = [(p["cached"], p["query"]) for p in training_pairs()[40:72]]
    lower = verifier.probabilities(pairs)
    first = 1 / (1 + np.exp(-verifier._logits(pairs)))  # each pair's first order alone
    threshold = float(np.median(first))  # half the pairs reach it in their first order
    monkeypatch.setattr(pair_verifier, "THRESHOLD", threshold)
    forwards = []
    pair_states = verifier._model.pair_states
    monkeypatch.setattr(
        verifier._model, "pair_states", lambda rows: forwards.append(rows) or pair_states(rows)
    )
    for pair, both, alone in zip(pairs, lower, first, strict=True):
        forwards.clear()
        probability = verifier.probability(*pair)
        assert (probability >= threshold) == (both >= threshold)  # the same verdict
        if alone >= threshold:
            assert probability == pytest.approx(both, abs=1e-6)
            assert forwards == [[pair], [pair[::-1]]]
        else:
            assert forwards == [[pair]]


def test_the_embedder_prepares_the_verifier_in_the_background(tiny_verifier_weights):
    embedder = Embedder.load()
    assert embedder.verifier_state == "off"
    thread = embedder.start_verifier(weights_file=tiny_verifier_weights)
    assert thread is not None
    thread.join(timeout=60)
    assert embedder.verifier_state == "ready"
    assert embedder.start_verifier() is None  # once


def test_a_missing_weights_file_leaves_the_verifier_unavailable(tmp_path):
    embedder = Embedder.load()
    thread = embedder.start_verifier(weights_file=tmp_path / "missing.safetensors")
    thread.join(timeout=60)
    assert embedder.verifier_state == "unavailable"
