"""``titan cache prepare-verifier``: the pair verifier's weights, from the folder when they are
there for these pairs and this recipe (else trained: minutes, not run here)."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from titan.cache import pair_training
from titan.cache.embedder import model_dir
from titan.cli.main import build_cli

pytestmark = pytest.mark.slow  # hashes the embedding model's weights


def test_prepare_verifier_prints_the_weights_already_in_the_folder(
    tmp_path, tiny_verifier_weights, monkeypatch
):
    name = pair_training.fingerprint(
        pair_training.training_pairs(), pair_training.Training(), model_dir()
    )
    shutil.copy(tiny_verifier_weights, tmp_path / f"{name}.safetensors")
    monkeypatch.setattr(pair_training, "train", lambda *a, **k: pytest.fail("trained again"))
    result = CliRunner().invoke(
        build_cli(), ["cache", "prepare-verifier", "--folder", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == str(tmp_path / f"{name}.safetensors")


def test_prepare_verifier_trains_when_the_folder_has_no_weights(tmp_path, monkeypatch):
    trained = []
    monkeypatch.setattr(
        pair_training, "train", lambda pairs, *a, **k: trained.append(len(pairs)) or {}
    )
    result = CliRunner().invoke(
        build_cli(), ["cache", "prepare-verifier", "--folder", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert trained == [len(pair_training.training_pairs())]
    assert list(tmp_path.glob("*.safetensors"))
