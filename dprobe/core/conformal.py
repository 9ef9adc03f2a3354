"""Split-conformal calibration: over model families for the cold-start and job-scale models, and the
finite-sample quantile (:func:`conformal_shift`) the series forecaster's shifts use as well.

Quantiles learnt from a few dozen runs cover the runs they were fitted on better than a new
architecture. Dealing the training families into folds, fitting without each fold and scoring on it
gives errors of the kind a new family will see; the shift that makes a quantile cover its level of
those errors is then added to it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def family_folds(families: Sequence[str], folds: int, seed: int) -> np.ndarray | None:
    """Fold (``0 .. folds - 1``) of each run, its family's: families dealt at random into ``folds``
    groups. None when there are fewer families than folds."""
    names = sorted(set(families))
    if len(names) < folds:
        return None
    group = dict(zip(np.random.default_rng(seed).permutation(names), np.arange(len(names)) % folds, strict=True))
    return np.array([group[f] for f in families])


def held_out_groups(families: Sequence[str] | np.ndarray, folds: int | None, seed: int) -> list[np.ndarray]:
    """Leave-family-out test sets (run indices): one per family, or with ``folds`` the families dealt at
    random into that many groups (:func:`family_folds`; one per family where there are fewer)."""
    if folds is not None and folds < 2:
        raise ValueError(f"folds must be at least 2, not {folds}")
    fams = np.asarray(families)
    fold = family_folds(list(fams), folds, seed) if folds is not None else None
    if folds is None or fold is None:
        return [np.flatnonzero(fams == f) for f in sorted(set(fams))]
    return [np.flatnonzero(fold == k) for k in range(folds)]


def conformal_shift(scores: np.ndarray, level: float) -> float:
    """The finite-sample conformal quantile of ``scores`` (measured minus predicted; NaN ignored): the
    shift that makes a prediction cover ``level`` of new cases. 0 without scores."""
    col = np.asarray(scores, dtype=np.float64)
    col = col[~np.isnan(col)]
    if not len(col):
        return 0.0
    return float(np.quantile(col, min(1.0, np.ceil(level * (len(col) + 1)) / len(col))))
