"""Fit the step cost model to a real engine's steps: seconds ≈ fixed + per_token · tokens +
per_pair · attention pairs + per_seq · sequences, by least squares with every coefficient
kept ≥ 0 (a negative one is dropped and the rest refitted), weighted so that short steps (the
decodes that dominate a run) count as much as long ones: the fit minimizes relative error."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from titan.planning.step_cost import LinearStepCost

_COLUMNS = ("fixed_s", "per_token_s", "per_pair_s", "per_seq_s")


@dataclass(frozen=True)
class StepSample:
    """One measured step: what it computed and how long it took (the whole ``step()``)."""

    num_tokens: int
    num_seqs: int
    num_pairs: int
    num_context_tokens: int
    seconds: float


@dataclass(frozen=True)
class Calibration:
    cost: LinearStepCost
    num_samples: int
    # |predicted − measured| / measured over the samples.
    median_relative_error: float
    p90_relative_error: float


def _design(samples: Sequence[StepSample]) -> np.ndarray:
    return np.array([[1.0, s.num_tokens, s.num_pairs, s.num_seqs] for s in samples], dtype=float)


def _nonnegative_least_squares(matrix: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least squares with coefficients ≥ 0: refit without the most negative one until none is."""
    active = list(range(matrix.shape[1]))
    solution = np.zeros(matrix.shape[1])
    while active:
        # Columns scaled to unit size keep the solve well conditioned (pairs are ~1e5).
        scales = np.abs(matrix[:, active]).max(axis=0)
        scales[scales == 0] = 1.0
        coefficients = np.linalg.lstsq(matrix[:, active] / scales, target, rcond=None)[0]
        coefficients = coefficients / scales
        if (coefficients >= 0).all():
            solution[active] = coefficients
            return solution
        active.pop(int(np.argmin(coefficients)))
    return solution


def fit_step_cost(samples: Sequence[StepSample], mixed_step_bias: float = 1.0) -> Calibration:
    """Raises ValueError with fewer samples than coefficients."""
    if len(samples) < len(_COLUMNS):
        raise ValueError(f"need at least {len(_COLUMNS)} step samples, got {len(samples)}")
    matrix = _design(samples)
    seconds = np.array([s.seconds for s in samples], dtype=float)
    weights = 1.0 / np.maximum(seconds, 1e-9)  # relative error
    solution = _nonnegative_least_squares(matrix * weights[:, None], seconds * weights)
    cost = LinearStepCost(
        **dict(zip(_COLUMNS, map(float, solution), strict=True)), mixed_step_bias=mixed_step_bias
    )
    errors = np.abs(matrix @ solution - seconds) / np.maximum(seconds, 1e-9)
    return Calibration(
        cost, len(samples), float(np.median(errors)), float(np.percentile(errors, 90))
    )
