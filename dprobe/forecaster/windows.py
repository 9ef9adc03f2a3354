"""Training windows for the forecaster: a LightningDataModule over the bundled series.

Each (data set, metric) pair is a *task* with its own lead times. Where a directory has a
``workloads.csv``, its series carry a workload vector (:mod:`dprobe.data.workloads`). Series are
split in time by a :class:`~dprobe.core.split.Split`: origins whose forecasts end before its
validation start train, those from there whose forecasts end before its test start validate, and
the rest of every series is left for ``dprobe evaluate``. A data set of whole jobs (h200-profiles:
one series per training run) is split by model family in the same shares instead
(:meth:`~dprobe.core.split.Split.group_role`): every origin of a training family's runs trains, of a
validation family's validates, and the test families are left for ``dprobe evaluate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler

from dprobe.core.split import Split
from dprobe.data.common import SeriesDataset
from dprobe.data.registry import load_series_dataset
from dprobe.data.workloads import check_token, make_embedder, workload_vectors
from dprobe.forecaster.features import (
    candidate_points,
    change_factor,
    make_features,
    normalise_targets,
    window_change,
    window_regime,
    window_scale,
)
from dprobe.forecaster.tasks import TaskSpec


@dataclass
class TaskSeries:
    spec: TaskSpec
    values: np.ndarray  # (S, T_max) NaN-padded on the right
    covariates: np.ndarray | None  # (S, T_max, C)
    lengths: np.ndarray  # (S,)
    workload: np.ndarray  # (S, D) workload vectors (dprobe.data.workloads), zeros where unknown
    known: np.ndarray  # (S,) bool: the series' workload is known

    def windows(self, series: np.ndarray, origin: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The ``context`` steps up to each ``origin`` (inclusive) of ``series``: values ``(N, context)`` and
        covariates ``(N, context, C)`` (None without any), NaN before a series starts."""
        idx = origin[:, None] + np.arange(-context + 1, 1)[None, :]
        valid = idx >= 0
        at = (series[:, None], np.clip(idx, 0, None))
        values = np.where(valid, self.values[at], np.nan)
        cov = None if self.covariates is None else np.where(valid[..., None], self.covariates[at], np.nan)
        return values, cov


@dataclass
class WindowBatch:
    """A batch of ``B`` windows of ``L`` steps, as :class:`WindowCollate` gathers them (CPU tensors).

    Window units: a window's values less its last observed value, over its scale
    (:func:`~dprobe.forecaster.features.make_features`)."""

    features: torch.Tensor  # (B, L, 2 + N_COVARIATES) float: values in window units, observed flags, covariates
    stats: torch.Tensor  # (B, N_STATS) float: the window's summary statistics (window_stats)
    weight: torch.Tensor  # (B,) float: loss weight (the task's, times the busy-window factor in training)
    target: torch.Tensor  # (B, H) float: the values at the task's leads in window units, NaN where unobserved
    task: torch.Tensor  # (B,) long: the window's task
    workload: torch.Tensor  # (B, D) float: the series' workload vector (dprobe.data.workloads), zeros if unknown
    known: torch.Tensor  # (B,) bool: the series' workload is known
    points: torch.Tensor  # (B, P) float: the simple point forecasts (SIMPLE_POINTS), window units
    scale: torch.Tensor  # (B,) float: window units -> the metric's units
    series: torch.Tensor  # (B,) long: index of the series in its task
    regime: torch.Tensor  # (B,) long: what the window's last steps did (REGIMES)


@dataclass(frozen=True)
class ChangeWeighting:
    """What :func:`change_factor` needs to weigh a window by how busy it is, per task."""

    typical: list[float]  # per task: the median change of its training windows
    mean: list[float]  # per task: the factor's mean there (divided out, so the task's share stays)
    calm_weight: float  # the most a calm or flat window counts, relative to a typical one


class _Origins(Dataset):
    """Rows (task, series, origin); windows are gathered in ``WindowCollate``."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.rows[i]


class WindowCollate:
    """Gather the windows and future targets of a batch of (task, series, origin) rows."""

    def __init__(self, tasks: list[TaskSeries], context_length: int, task_weights: list[float],
                 covariate_dropout: float = 0.0, seed: int = 0,
                 change_weighting: ChangeWeighting | None = None, workload_dropout: float = 0.0) -> None:
        self.tasks, self.context, self.task_weights = tasks, context_length, task_weights
        self.covariate_dropout, self.workload_dropout = covariate_dropout, workload_dropout
        self.change_weighting = change_weighting
        self.rng = np.random.default_rng(seed)

    def __call__(self, rows: list[np.ndarray]) -> WindowBatch:
        rows_arr = np.stack(rows)
        feats, stats, targets, task_ids, weights, cond, known, points, scales, series, regimes = (
            [] for _ in range(11))
        for k, ts in enumerate(self.tasks):
            sel = np.flatnonzero(rows_arr[:, 0] == k)
            if not len(sel):
                continue
            s, t = rows_arr[sel, 1], rows_arr[sel, 2]
            vals, cov = ts.windows(s, t, self.context)
            if cov is not None and self.covariate_dropout > 0:  # as online, where request rates may not be scraped
                cov[self.rng.random(len(cov)) < self.covariate_dropout] = np.nan
            x, st, last, scale = make_features(vals, cov, ts.spec.scale_floor)
            fut = ts.values[s[:, None], t[:, None] + np.asarray(ts.spec.leads)[None, :]]
            feats.append(x)
            stats.append(st)
            points.append(candidate_points(vals, last, scale))
            regimes.append(window_regime(vals))
            scales.append(scale)
            series.append(s)
            w = np.full(len(sel), self.task_weights[k], dtype=np.float32)
            if self.change_weighting is not None:
                cw = self.change_weighting
                factor = change_factor(window_change(x[..., 0], x[..., 1]), cw.typical[k], cw.calm_weight) / cw.mean[k]
                w = (w * factor).astype(np.float32)
            weights.append(w)
            targets.append(normalise_targets(fut, last, scale))
            task_ids.append(np.full(len(sel), k))
            cond.append(ts.workload[s])
            flags = ts.known[s].copy()
            if self.workload_dropout > 0:  # as for a job whose model the sidecar was not told
                flags &= self.rng.random(len(flags)) >= self.workload_dropout
            known.append(flags)
        return WindowBatch(
            features=torch.from_numpy(np.concatenate(feats)).float(),
            stats=torch.from_numpy(np.concatenate(stats)).float(),
            weight=torch.from_numpy(np.concatenate(weights)).float(),
            target=torch.from_numpy(np.concatenate(targets)).float(),
            task=torch.from_numpy(np.concatenate(task_ids)).long(),
            workload=torch.from_numpy(np.concatenate(cond)).float(),
            known=torch.from_numpy(np.concatenate(known)),
            points=torch.from_numpy(np.concatenate(points)).float(),
            scale=torch.from_numpy(np.concatenate(scales)).float(),
            series=torch.from_numpy(np.concatenate(series)).long(),
            regime=torch.from_numpy(np.concatenate(regimes)).long(),
        )


class _DataSettings(Protocol):
    """:class:`SeriesDataModule`'s arguments as its ``hparams`` hold them (``save_hyperparameters``)."""

    datasets: Sequence[str]
    context_length: int
    batch_size: int
    samples_per_epoch: int
    val_samples: int
    val_start: float
    test_start: float
    min_history: int
    num_workers: int
    seed: int
    workload_cache: str | None
    covariate_dropout: float
    calm_weight: float | None
    workload_dropout: float
    job_share: float
    workload_token: str
    graph_encoder: str | None


class SeriesDataModule(pl.LightningDataModule):
    """Windows of every metric of the given series data sets (alibaba-genai-2026, helios-earth-vc layouts).

    ``val_start``, ``test_start``: the :class:`~dprobe.core.split.Split` (:attr:`split`), recorded in the
    checkpoint; plain numbers here, so that the Lightning checkpoints' hyperparameters stay plain."""

    def __init__(self, datasets: list[str], context_length: int = 128, batch_size: int = 256,
                 samples_per_epoch: int = 20000, val_samples: int = 4000,
                 val_start: float = Split.validation_start, test_start: float = Split.test_start,
                 min_history: int = 16, num_workers: int = 0, seed: int = 0,
                 workload_cache: str | None = None, covariate_dropout: float = 0.0,
                 calm_weight: float | None = None, workload_dropout: float = 0.0, job_share: float = 0.2,
                 workload_token: str = "vector", graph_encoder: str | None = None) -> None:
        """``workload_token``, ``graph_encoder``: what a known workload's series are given
        (:data:`dprobe.data.workloads.TOKENS`; the graph encoder of a token with an embedding, None: the
        shipped one); the model's ``workload_token`` and ``graph_encoder`` must be the same."""
        super().__init__()
        check_token(workload_token)
        if not 0 < job_share < 1:
            raise ValueError(f"job_share must be between 0 and 1 (the share of training windows drawn from data "
                             f"sets of whole jobs, when there are both kinds), got {job_share!r}")
        if not 0 <= workload_dropout < 1:
            raise ValueError(f"workload_dropout must be in [0, 1) (the share of training windows whose known "
                             f"workload is hidden), got {workload_dropout!r}")
        if calm_weight is not None and not calm_weight >= 1:
            raise ValueError(f"calm_weight must be at least 1 (how many times a calm window may count, relative "
                             f"to a typical one), or null to weigh every window alike; got {calm_weight!r}")
        self.save_hyperparameters()
        self.split = Split(validation_start=val_start, test_start=test_start)
        self.tasks: list[TaskSeries] = []
        self.job_tasks: list[bool] = []  # per task: from a data set of whole jobs (split by family)
        self._train_rows: np.ndarray | None = None  # (N, 3) (task, series, origin), by setup()
        self._val_rows: np.ndarray | None = None
        self._calibration_rows: np.ndarray | None = None
        self.task_weights: list[float] = []
        self.change_weighting: ChangeWeighting | None = None

    @property
    def _settings(self) -> _DataSettings:
        """The module's arguments (its ``hparams``, which ``save_hyperparameters`` made of them)."""
        return cast(_DataSettings, self.hparams)

    @staticmethod
    def _set_up(rows: np.ndarray | None) -> np.ndarray:
        """``rows`` made by :meth:`setup`; a RuntimeError before it ran."""
        if rows is None:
            raise RuntimeError("the data module has no windows yet: call setup() first")
        return rows

    @property
    def task_specs(self) -> list[TaskSpec]:
        return [t.spec for t in self.tasks]

    def setup(self, stage: str | None = None) -> None:
        if self.tasks:
            return
        hp = self._settings
        train_rows: list[np.ndarray] = []
        val_rows: list[np.ndarray] = []
        embedder = make_embedder(hp.workload_token, hp.graph_encoder, hp.workload_cache)  # one for every directory
        for directory in hp.datasets:
            ds = load_series_dataset(Path(directory))
            covs = ds.covariate_arrays()
            workload_ids: list[str] | None = None
            for target in ds.targets:
                arrays = ds.arrays(target)
                ids = sorted(arrays)
                # padded past the longest series by the longest lead: every origin's targets can be looked up
                t_max = max(len(a) for a in arrays.values()) + max(ds.lead_steps)
                values = np.full((len(ids), t_max), np.nan)
                cov = np.full((len(ids), t_max, len(ds.covariates)), np.nan) if ds.covariates else None
                lengths = np.array([len(arrays[u]) for u in ids])
                for i, u in enumerate(ids):
                    values[i, : lengths[i]] = arrays[u]
                    if cov is not None:
                        cov[i, : lengths[i]] = covs[u]
                roles = self._roles(ds, ids)
                train_part = ([arrays[u] for u in ids if roles[u] == "train"] if roles else
                              [arrays[u][: self.split.validation_index(len(arrays[u]))] for u in ids])
                levels = window_scale(np.array([[np.nanmean(np.abs(a)) if np.isfinite(a).any() else np.nan]
                                                for a in train_part]), 0.0)
                floor = float(0.5 * np.median(levels[levels > 0])) if (levels > 0).any() else 1.0
                spec = TaskSpec(name=target, dataset=ds.name, leads=ds.lead_steps,
                                step_seconds=ds.freq.total_seconds(), covariates=tuple(ds.covariates),
                                scale_floor=floor)
                if workload_ids != ids:  # the same series for every target of a data set: computed once
                    workload, known = workload_vectors(directory, [str(u) for u in ids], hp.workload_cache,
                                                       hp.workload_token, embedder=embedder)
                    workload_ids = ids
                k = len(self.tasks)
                self.tasks.append(TaskSeries(spec=spec, values=values, covariates=cov, lengths=lengths,
                                             workload=workload, known=known))
                self.job_tasks.append(roles is not None)
                h = max(ds.lead_steps)
                validated_before = sum(len(v) for v in val_rows)
                for i, n in enumerate(lengths):
                    observed = np.cumsum(~np.isnan(values[i, :n]))
                    if roles:  # a whole job: all its origins (from its first second on) train or validate, or none
                        origins = np.flatnonzero((observed >= 1) & (np.arange(n) >= ds.first_origin)
                                                 & (np.arange(n) + min(ds.lead_steps) < n))
                        role = roles[ids[i]]
                        tr = origins if role == "train" else origins[:0]
                        va = origins if role == "validation" else origins[:0]
                    else:
                        tr, va = self.split.fit_origins(np.flatnonzero(observed >= hp.min_history), n, h)
                    train_rows.append(np.stack([np.full(len(tr), k), np.full(len(tr), i), tr], axis=1))
                    val_rows.append(np.stack([np.full(len(va), k), np.full(len(va), i), va], axis=1))
                if roles and sum(len(v) for v in val_rows) == validated_before:
                    groups = ds.groups or {}  # there are roles: the data set has groups
                    families = len({groups.get(str(u), str(u)) for u in ids})
                    raise ValueError(
                        f"{directory}: none of its {families} model families falls into the validation share "
                        f"({self.split.validation_start:g}-{self.split.test_start:g} of families, by name), so "
                        "nothing would validate its runs: give it more families or a wider validation share "
                        "(data.val_start, data.test_start)")
        train = self._train_rows = np.concatenate(train_rows).astype(np.int64)
        val = np.concatenate(val_rows).astype(np.int64)
        self._calibration_rows = val  # every validation window: point choice and quantile calibration
        rng = np.random.default_rng(hp.seed)
        self._val_rows = self._sample_validation(val, rng)
        self.task_weights, self.change_weighting = self._balance_tasks(rng)
        if not len(train):
            raise ValueError(f"no training windows in {hp.datasets}: series too short for the lead times")

    def _sample_validation(self, val: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The windows each epoch validates on, ``val_samples`` of them: where there are both series and whole
        jobs, every window of the validation families' runs (a few hundred: the left-out families that
        ``val/select`` weighs, so that a sample does not leave them a handful; a sample of half of
        ``val_samples`` where there are more) and a sample of the series' validation span for the rest; else a
        sample of all."""
        n = self._settings.val_samples
        jobs = np.asarray(self.job_tasks, dtype=bool)[val[:, 0]]
        if len(val) <= n:
            return val
        if not jobs.any() or jobs.all():
            return val[rng.choice(len(val), n, replace=False)]
        kept, rest = val[jobs], val[~jobs]
        if len(kept) > n // 2:
            kept = kept[rng.choice(len(kept), n // 2, replace=False)]
        return np.concatenate([kept, rest[rng.choice(len(rest), min(len(rest), n - len(kept)), replace=False)]])

    def _roles(self, ds: SeriesDataset, ids: list[str]) -> dict[str, str] | None:
        """Series id -> ``"train"`` / ``"validation"`` / ``"test"`` for a data set of whole jobs (split by
        its groups, the model families); None for one split in time."""
        if ds.groups is None:
            return None
        return {u: self.split.group_role(ds.groups.get(str(u), str(u))) for u in ids}

    def _balance_tasks(self, rng: np.random.Generator, n: int = 2000
                       ) -> tuple[list[float], ChangeWeighting | None]:
        """Per-task loss weights: 1 / the last-value forecast's mean error in window units; and, with
        ``calm_weight``, what :func:`change_factor` needs per task (its windows' median change and
        the factor's mean, so that the task's share of the loss stays as it was).

        Without the task weights the task with the noisiest windows (duty cycle spikes) would
        dominate the loss and the smooth ones (memory) would be ignored. Within a task, a window's
        errors in window units grow with how busy it is, so busy windows would drown out the calm
        ones, where the last value is hard to beat; ``calm_weight`` evens that out.
        """
        rows = self._set_up(self._train_rows)
        calm = self._settings.calm_weight
        collate = WindowCollate(self.tasks, self._settings.context_length, [1.0] * len(self.tasks))
        weights: list[float] = []
        typical: list[float] = []
        mean: list[float] = []
        for k in range(len(self.tasks)):
            sel = rows[rows[:, 0] == k]
            sel = sel[rng.choice(len(sel), min(n, len(sel)), replace=False)]
            batch = collate(list(sel))
            y = batch.target.numpy()
            err = float(np.nanmean(np.abs(y))) if np.isfinite(y).any() else 1.0
            weights.append(1.0 / max(err, 1e-3))
            if calm is not None:
                x = batch.features.numpy()
                change = window_change(x[..., 0], x[..., 1])
                typical.append(max(float(np.median(change)), 1e-6))
                mean.append(float(change_factor(change, typical[-1], calm).mean()))
        total = float(np.mean(weights))
        return [w / total for w in weights], (ChangeWeighting(typical, mean, float(calm)) if calm is not None else None)

    def _loader(self, rows: np.ndarray, sampler: WeightedRandomSampler | None = None, shuffle: bool = False,
                train: bool = False) -> DataLoader:
        hp = self._settings
        collate = WindowCollate(self.tasks, hp.context_length, self.task_weights,
                                hp.covariate_dropout if train else 0.0, hp.seed,
                                self.change_weighting if train else None,
                                hp.workload_dropout if train else 0.0)
        return DataLoader(_Origins(rows), batch_size=hp.batch_size, sampler=sampler, shuffle=shuffle,
                          collate_fn=collate, num_workers=hp.num_workers, persistent_workers=hp.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        hp = self._settings
        rows = self._set_up(self._train_rows)
        counts = np.bincount(rows[:, 0], minlength=len(self.tasks)).astype(float)
        jobs = np.asarray(self.job_tasks, dtype=bool)
        # every task drawn equally often; where there are series and job tasks, the job tasks share job_share
        share = np.ones(len(self.tasks))
        if jobs.any() and not jobs.all():
            share = np.where(jobs, hp.job_share / jobs.sum(), (1 - hp.job_share) / (~jobs).sum())
        weights = share[rows[:, 0]] / np.maximum(counts[rows[:, 0]], 1)
        n = min(hp.samples_per_epoch, len(rows) * 4)
        gen = torch.Generator().manual_seed(hp.seed)
        # torch annotates weights as Sequence[float], but takes a tensor (it calls torch.as_tensor on them)
        sampler = WeightedRandomSampler(torch.as_tensor(weights),  # type: ignore[arg-type]
                                        num_samples=n, replacement=True, generator=gen)
        return self._loader(rows, sampler=sampler, train=True)

    def val_dataloader(self) -> DataLoader:
        """``val_samples`` windows drawn from the validation span, for early stopping each epoch."""
        return self._loader(self._set_up(self._val_rows))

    @property
    def calibration_rows(self) -> np.ndarray:
        """``(N, 3)`` (task, series, origin) of every window of the validation span."""
        return self._set_up(self._calibration_rows)

    def calibration_dataloader(self) -> DataLoader:
        """Every window of the validation span, for choosing the point forecast and calibrating the
        quantiles after training (one pass, so it can afford more windows than each epoch's check)."""
        return self._loader(self._set_up(self._calibration_rows))
