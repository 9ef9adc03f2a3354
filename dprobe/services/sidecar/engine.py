"""The forecast cycle: all fresh targets, in batches of :data:`BATCH_TARGETS` per metric, published as one
snapshot."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from dprobe.core.names import QUANTILES, SIDECAR_METRICS
from dprobe.forecaster.base import Forecaster, ForecastInput
from dprobe.forecaster.loading import serves
from dprobe.services.sidecar.graphs import GraphResolver
from dprobe.services.sidecar.state import ForecastSnapshot
from dprobe.services.sidecar.window import WindowStore

log = logging.getLogger(__name__)
BOUNDS = {"gpu_memory_bytes": (0.0, np.inf), "gpu_utilization_ratio": (0.0, 1.0)}
# targets forecast in one batch: a cycle's memory is that of this many targets, however many are tracked (2,000
# targets in one batch took the sidecar's peak RSS 200 MiB higher: docs/sidecar.md, Memory)
BATCH_TARGETS = 256


class ForecastEngine:
    """Runs the forecaster over the windows of every fresh target and keeps the latest snapshot."""

    def __init__(self, store: WindowStore, forecaster: Forecaster, horizons: list[int], stale_after: float,
                 drop_after: float, min_points: int = 3, graphs: GraphResolver | None = None,
                 observe_seconds: Callable[[float], None] | None = None, clock: Callable[[], float] = time.time):
        self.store, self.forecaster = store, forecaster
        self.metrics = tuple(m for m in SIDECAR_METRICS if serves(forecaster, m))  # a checkpoint may forecast one
        for metric in sorted(set(SIDECAR_METRICS) - set(self.metrics)):
            log.warning("%s does not forecast %s: its forecasts are left out", forecaster.name, metric)
        self.horizons = tuple(int(h) for h in horizons)
        self.leads = tuple(max(1, int(round(h / store.step))) for h in self.horizons)
        self.stale_after, self.drop_after, self.min_points = stale_after, drop_after, min_points
        self.graphs = graphs
        self.observe_seconds = observe_seconds
        self.clock = clock
        self.snapshot: ForecastSnapshot | None = None
        self.on_publish: Callable[[ForecastSnapshot], object] | None = None  # e.g. pre-render for /metrics
        self.errors_total = 0
        self.cycles_total = 0
        self.failing = False

    def _cycle(self) -> ForecastSnapshot | None:
        now = self.clock()
        for target in self.store.drop_older_than(now - self.drop_after):
            if self.graphs is not None:
                self.graphs.forget(target)
            log.debug("target %s dropped: no sample for %g s", target, self.drop_after)
        for target in self.store.take_shed():  # max_targets were tracked: shed for newer ones
            if self.graphs is not None:
                self.graphs.forget(target)
        latest = self.store.snapshot_latest()
        targets = sorted(t for t, s in latest.items() if now - s.ts <= self.stale_after)
        snap = self._forecast(targets, latest, now) if targets else None
        if snap is not None:
            self.snapshot = snap
            if self.on_publish is not None:
                self.on_publish(snap)
        return snap

    def cycle(self) -> ForecastSnapshot | None:
        """Drop vanished targets, forecast the fresh ones, publish; returns the new snapshot (or None)."""
        started = time.perf_counter()
        try:
            snap = self._cycle()
        except Exception as exc:  # a model failure, or a bug: keep serving, forecasts age out and are hidden
            self.errors_total += 1
            if not self.failing:
                log.exception("forecasting failed: %s: %s (further failures are counted, not logged)",
                              type(exc).__name__, exc)
            self.failing = True
            return None
        if self.failing:
            log.warning("forecasting recovered")
            self.failing = False
        self.cycles_total += 1
        if self.observe_seconds is not None:
            self.observe_seconds(time.perf_counter() - started)
        return snap

    def _forecast(self, targets: list[str], latest: dict, now: float) -> ForecastSnapshot | None:
        parts = [part for i in range(0, len(targets), BATCH_TARGETS)
                 if (part := self._forecast_batch(targets[i:i + BATCH_TARGETS], latest, now)) is not None]
        if not parts:
            return None
        kept = [t for part_targets, _, _ in parts for t in part_targets]
        quantiles = {metric: np.concatenate([q[metric] for _, q, _ in parts]) for metric in SIDECAR_METRICS}
        return ForecastSnapshot(
            made_at=now, targets=tuple(kept), input_ts=np.array([latest[t].ts for t in kept]),
            horizons=self.horizons, levels=tuple(QUANTILES), quantiles=quantiles,
            labels=tuple(latest[t].labels for t in kept), tokens=tuple(t for _, _, tok in parts for t in tok),
        )

    def _tokens(self, graphs: list | None, n: int) -> list[str]:
        """Per target, the workload token its forecast uses (``graph``, ``vector``, ``unknown``); none for a
        forecaster without workload tokens (a baseline)."""
        token_of = getattr(self.forecaster, "token_of", None)
        if token_of is None:
            return []
        if graphs is None or not self.metrics:
            return ["unknown"] * n
        # the token of the first metric's task (both sidecar metrics come from the same data set's tasks)
        return [token_of(g, self.metrics[0], self.store.step) for g in graphs]

    def _forecast_batch(self, targets: list[str], latest: dict, now: float
                        ) -> tuple[list[str], dict[str, np.ndarray], list[str]] | None:
        """The targets of ``targets`` with enough history, their quantiles by metric (one batch each) and the
        workload token each forecast used (:meth:`_tokens`)."""
        windows = self.store.windows(targets)  # all NaN for a target shed since the cycle began
        enough = np.zeros(len(targets), dtype=bool)
        for metric in self.metrics:
            enough |= np.sum(~np.isnan(windows[metric]), axis=1) >= self.min_points
        keep = np.flatnonzero(enough)
        if keep.size == 0:
            return None
        kept = [targets[i] for i in keep]
        graphs = [self.graphs.graph(t) for t in kept] if self.graphs is not None and self.graphs.active else None
        quantiles = {}
        ages = now - np.array([latest[t].ts for t in kept])
        for metric in SIDECAR_METRICS:
            values = windows[metric][keep]
            has = np.sum(~np.isnan(values), axis=1) >= self.min_points
            # each metric's own freshness: steps since its last reading (a target whose utilisation turned
            # NaN while its memory goes on has no utilisation forecast once that reading is stale_after old)
            has &= ages + np.argmax(~np.isnan(values[:, ::-1]), axis=1) * self.store.step <= self.stale_after
            if metric not in self.metrics:
                has[:] = False
            out = np.full((len(kept), len(self.horizons), len(QUANTILES)), np.nan)
            if has.any():
                rows = np.flatnonzero(has)
                batch = ForecastInput(values=values[rows], metric=metric, leads=self.leads,
                                      step_seconds=self.store.step,
                                      graphs=[graphs[i] for i in rows] if graphs is not None else None)
                fc = self.forecaster.predict(batch)
                q = np.asarray(fc.quantiles, dtype=np.float64)
                if q.shape != (len(rows), len(self.leads), len(QUANTILES)):
                    raise ValueError(f"{self.forecaster.name} returned quantiles of shape {q.shape} for {metric}")
                lo, hi = BOUNDS[metric]
                out[rows] = np.sort(np.clip(q, lo, hi), axis=-1)
            quantiles[metric] = out
        return kept, quantiles, self._tokens(graphs, len(kept))
