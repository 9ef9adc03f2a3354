"""The train / validation / test split of every series in time: one definition for training, evaluation and
the benchmarks, recorded in each trained forecaster's checkpoint.

A series of ``n`` steps is cut at two indices: ``int(n * validation_start)`` and ``int(n * test_start)``.
A window trains when its forecasts end before the first, validates (early stopping, the point choice,
the quantiles' calibration) when its origin is at or after the first and its forecasts end before the
second, and the test span, from the second to the end, is left for ``dprobe evaluate``.

A data set of whole jobs (h200-profiles: one short series per training run) is split by group instead,
in the same shares: each model family falls into the training, validation or test part by a stable hash
of its name (:meth:`Split.group_role`), so that the test part holds families never trained on.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, fields

import numpy as np


@dataclass(frozen=True)
class Split:
    """Where each series' validation and test spans start, as shares of its length."""

    validation_start: float = 0.6
    test_start: float = 0.7

    def __post_init__(self) -> None:
        if not 0 <= self.validation_start <= self.test_start <= 1:
            raise ValueError(f"a split needs 0 <= validation_start <= test_start <= 1, got validation_start "
                             f"{self.validation_start!r}, test_start {self.test_start!r}")

    @classmethod
    def from_dict(cls, d: dict | None) -> Split:
        """The split a checkpoint records (:meth:`to_dict`); the default one where it records none (a
        checkpoint written before splits were recorded was trained with the default)."""
        return cls(**{f.name: float(d[f.name]) for f in fields(cls) if f.name in d}) if d else cls()

    def to_dict(self) -> dict[str, float]:
        """Plain floats: what a checkpoint (loaded with ``weights_only=True``) or an ONNX export's metadata holds."""
        return {k: float(v) for k, v in asdict(self).items()}

    @property
    def test_fraction(self) -> float:
        """The share of each series in the test span."""
        return 1 - self.test_start

    def with_test_fraction(self, fraction: float) -> Split:
        """This split with the last ``fraction`` of each series as test span (``dprobe evaluate
        --test-fraction``); a validation span reaching past the new test start ends there."""
        test_start = 1 - fraction
        return Split(validation_start=min(self.validation_start, test_start), test_start=test_start)

    def validation_index(self, n: int) -> int:
        """Where the validation span of a series of ``n`` steps starts (the end of its training span)."""
        return int(n * self.validation_start)

    def test_index(self, n: int) -> int:
        """Where the test span of a series of ``n`` steps starts (the end of its validation span)."""
        return int(n * self.test_start)

    def fit_origins(self, origins: np.ndarray, n: int, horizon: int) -> tuple[np.ndarray, np.ndarray]:
        """Of the forecast ``origins`` of a series of ``n`` steps, forecasting up to ``horizon`` steps ahead:
        those that train (forecasts end before the validation span) and those that validate (origin in the
        validation span, forecasts end before the test span)."""
        v0, t0 = self.validation_index(n), self.test_index(n)
        return origins[origins + horizon < v0], origins[(origins >= v0) & (origins + horizon < t0)]

    def group_role(self, group: str) -> str:
        """``"train"``, ``"validation"`` or ``"test"``: the part of a data set split by group that the series of
        ``group`` (a model family) belong to, by where a stable hash of its name falls in [0, 1) against
        the two shares; the same on every machine and in every run."""
        u = zlib.crc32(group.encode()) / 2**32
        return "train" if u < self.validation_start else "validation" if u < self.test_start else "test"

    def reaches_into(self, other: Split) -> bool:
        """Whether a model fitted with this split saw windows of ``other``'s test span (its validation span
        ends later), so that scoring it there would count windows it trained or was calibrated on."""
        return self.test_start > other.test_start
