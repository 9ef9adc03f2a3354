"""Forecasting with a trained network, independent of how the network is run.

:class:`TrainedForecaster` holds what a checkpoint knows (tasks, leads, point
sources, the split it was fitted with) and turns windows into forecasts; subclasses only run the
network: :class:`dprobe.forecaster.checkpoint.ModelForecaster` with torch,
:class:`OnnxForecaster` with ONNX Runtime (no torch import: what the sidecar uses).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dprobe.core.split import Split
from dprobe.forecaster.base import Forecast, ForecastInput
from dprobe.forecaster.features import (
    REGIMES,
    candidate_points,
    last_observed,
    make_features,
    served_point,
    window_regime,
)
from dprobe.forecaster.tasks import TaskSpec

if TYPE_CHECKING:
    from dprobe.graph.embed import WorkloadEmbedder

KIND = "dprobe-forecaster"
# metric asked for -> (task it can be served by, factor from the metric's units to the task's)
METRIC_ALIASES: dict[str, tuple[tuple[str, float], ...]] = {
    "gpu_utilization_ratio": (("gpu_duty_cycle_pct", 100.0),),
}
FORMAT = 1


class TrainedForecaster:
    """Forecasting logic shared by the torch and ONNX Runtime forecasters (``_network`` differs)."""

    name = "dprobe"

    def _setup(self, meta: dict) -> None:
        hp = dict(meta["hparams"])
        self.tasks = [TaskSpec.from_dict(t) for t in meta["tasks"]]
        self.point_sources = meta.get("point_sources") or [["model"] * len(t.leads) for t in self.tasks]
        self.quantile_shifts = [np.asarray(s, dtype=float) for s in meta.get("quantile_shifts") or []]
        per_regime = (any(not isinstance(c, str) for task in self.point_sources for c in task)
                      or any(s.ndim == 3 for s in self.quantile_shifts))
        if per_regime and tuple(meta.get("regimes") or ()) != REGIMES:
            raise ValueError(f"its point forecasts and quantiles are per regime of {meta.get('regimes')}, this "
                             f"dprobe's regimes are {list(REGIMES)}: train it again")
        # per task: how the quantiles' spread grows from lead 0 to the first trained lead (1: linearly,
        # 0.5: as the square root of the lead; select_short_lead_exponents); older checkpoints: linearly
        self.short_lead_exponents = [float(e) for e in meta.get("short_lead_exponents") or [1.0] * len(self.tasks)]
        self.split = Split.from_dict(meta.get("split"))  # older checkpoints: the default split
        self.context_length = int(hp["context_length"])
        self.quantile_levels = tuple(hp.get("quantiles", (0.5, 0.9, 0.99)))
        self.version = meta.get("dprobe_version", "?")
        self.workload_inputs = bool(hp.get("use_graph"))  # the network takes workload tokens
        # ... and they mean something: its known-workload path saw training series with a known workload
        self.conditioned = self.workload_inputs and bool(meta.get("workloads_trained"))
        self.workload_token = str(hp.get("workload_token") or "vector")  # dprobe.data.workloads.TOKENS
        self.token_length = int(hp.get("d_graph") or 0)  # 0: the vector's (older checkpoints)
        # per task: its training series had a known workload (older checkpoints: every task), so a graph given
        # for a window of another task is left out: that task's token was never trained with one
        tasks_trained = meta.get("workload_tasks")
        self.workload_tasks = ([bool(v) for v in tasks_trained] if tasks_trained is not None
                               else [True] * len(self.tasks))
        # the graph encoder of a token with an embedding: {path, sha256, mode, dim, version}
        self.graph_encoder: dict[str, Any] | None = meta.get("graph_encoder") if self.conditioned else None
        if self.graph_encoder is not None:
            self._check_encoder(self.graph_encoder)
        self._embedder: WorkloadEmbedder | None = None

    def _check_encoder(self, enc: dict[str, Any]) -> None:
        """Refuse a checkpoint whose graph encoder ``enc`` (its record) is not there, or is not the file it was
        trained with."""
        from dprobe.graph.identity import file_digest, resolve_encoder_path

        path = resolve_encoder_path(enc.get("path"))
        if not path.is_file():
            raise ValueError(f"its workload token reads the graph encoder {enc.get('path')}, which is not there")
        if file_digest(path) != enc.get("sha256"):
            raise ValueError(f"its workload token reads the graph encoder {path}, and that file is not the one it "
                             "was trained with (SHA-256 differs): train it again, or give it that encoder")
        self.encoder_path = path

    @property
    def embeds_graphs(self) -> bool:
        """Whether a known workload's token includes a graph encoder's embedding (``graph_encoder``)."""
        return self.graph_encoder is not None

    def token_of(self, graph: object | None, metric: str | None = None, step_seconds: float | None = None) -> str:
        """Which workload token a forecast given ``graph`` uses (of ``metric`` at ``step_seconds``, when given):
        ``graph`` (a GNN embedding and the vector), ``vector`` (the vector alone) or ``unknown`` (the
        unknown-workload embedding: no graph, a forecaster that reads none, a task never trained with a known
        workload, or a graph whose embedding is not there)."""
        if graph is None or not self.conditioned:
            return "unknown"
        if metric is not None and not self.workload_tasks[self.task_for(metric, step_seconds)[0]]:
            return "unknown"
        if not self.embeds_graphs:
            return "vector"
        return "graph" if getattr(graph, "embedding", None) is not None or hasattr(graph, "edges") else "unknown"

    def embedder(self) -> WorkloadEmbedder:
        """The :class:`~dprobe.graph.embed.WorkloadEmbedder` that embeds graphs given whole (imports torch)."""
        if self._embedder is None:
            from dprobe.graph.embed import WorkloadEmbedder

            if self.graph_encoder is None:
                raise ValueError("this forecaster's workload token has no graph embedding: it embeds no graphs")
            self._embedder = WorkloadEmbedder(self.encoder_path, self.graph_encoder["mode"])
        return self._embedder

    def _network(self, x: np.ndarray, stats: np.ndarray, task: np.ndarray, cond: np.ndarray | None = None,
                 known: np.ndarray | None = None) -> np.ndarray:
        raise NotImplementedError

    def _token_length(self) -> int:
        if not self.token_length:
            from dprobe.data.workloads import workload_dim

            self.token_length = workload_dim()
        return self.token_length

    def _workloads(self, graphs: list | None, n: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Workload tokens ``(B, D)`` and known flags ``(B,)`` (float) from the per-row graphs, if any: a
        ``ModelGraph`` (embedded here where the token has an embedding) or a summary with its ``embedding``
        (the sidecar's); a row whose token cannot be made (:meth:`token_of` ``unknown``) is unknown."""
        if not self.conditioned or not graphs or all(g is None for g in graphs):
            return None, None
        from dprobe.data.workloads import token_vector

        cond = np.zeros((n, self._token_length()), dtype=np.float32)
        known = np.zeros(n, dtype=np.float32)
        tokens: dict[int, np.ndarray | None] = {}  # by graph object: a job's windows share its graph
        for i, g in enumerate(graphs):
            if g is None or self.token_of(g) == "unknown":
                continue
            if id(g) not in tokens:
                embedder = self.embedder() if self.embeds_graphs and getattr(g, "embedding", None) is None else None
                tokens[id(g)] = token_vector(g, self.workload_token, embedder)
            if tokens[id(g)] is not None:
                cond[i], known[i] = tokens[id(g)], 1.0
        return cond, known

    def task_for(self, metric: str, step_seconds: float | None = None) -> tuple[int, TaskSpec, float]:
        """The task trained on ``metric`` (if several, the closest step among those no finer than
        ``step_seconds``) and the unit factor to its units.

        ``gpu_utilization_ratio`` (0-1, what NVML / DCGM report) is served by a
        task trained on ``gpu_duty_cycle_pct`` (percent) with a factor of 100.
        """
        names = [metric, *[task for task, _ in METRIC_ALIASES.get(metric, ())]]
        for name in names:
            matches = [(k, t) for k, t in enumerate(self.tasks) if t.name == name]
            if matches:
                factor = dict(METRIC_ALIASES.get(metric, ())).get(name, 1.0)
                if step_seconds is None:
                    return (*matches[0], factor)
                # a window can be averaged into a coarser task's steps, never refined into a finer one's (the
                # 0.1 s job task does not serve a 15 s scrape): tasks at least as coarse first, then the closest
                usable = [kt for kt in matches if kt[1].step_seconds >= 0.67 * step_seconds] or matches
                k, t = min(usable, key=lambda kt: abs(np.log(kt[1].step_seconds / step_seconds)))
                return k, t, factor
        raise ValueError(f"this checkpoint forecasts {sorted({t.name for t in self.tasks})}, not {metric!r}")

    def window_seconds(self, metric: str) -> float:
        """Seconds of history a forecast of ``metric`` reads: the network's context at its task's step."""
        _, spec, _ = self.task_for(metric)
        return self.context_length * spec.step_seconds

    def max_horizon_seconds(self, metric: str) -> float:
        _, spec, _ = self.task_for(metric)
        return max(spec.leads) * spec.step_seconds

    def predict_task(self, k: int, spec: TaskSpec, values: np.ndarray, cov: np.ndarray | None,
                     cond: np.ndarray | None = None, known: np.ndarray | None = None) -> np.ndarray:
        """Quantiles at task ``k``'s own leads, in the task's units: ``(B, H_task, Q)``, from windows ``values``
        ``(B, L)`` at the task's step (covariates ``cov`` ``(B, L, C)``, workload vectors ``cond`` and flags
        ``known``, or None); what :meth:`predict` interpolates to the leads it is asked for."""
        n = self.context_length
        if values.shape[1] < n:  # pad the left with gaps
            values = np.concatenate([np.full((len(values), n - values.shape[1]), np.nan), values], 1)
        values = values[:, -n:]
        if cov is not None:
            if cov.shape[1] < n:
                cov = np.concatenate([np.full((len(cov), n - cov.shape[1], cov.shape[2]), np.nan), cov], 1)
            cov = cov[:, -n:]
        x, stats, last, scale = make_features(values, cov, spec.scale_floor)
        q = self._network(x, stats, np.full(len(x), k, dtype=np.int64), cond, known).astype(np.float64)
        regime = window_regime(values)
        if self.quantile_shifts:  # conformal calibration on the validation windows (per regime: (R, H, Q))
            shift = self.quantile_shifts[k]
            q = q + (shift[regime] if shift.ndim == 3 else shift[None])[:, : q.shape[1], :]
        q = np.sort(q, axis=-1)
        # the validation-selected point forecast replaces the p50
        q[..., 0] = served_point(q[..., 0], candidate_points(values, last, scale), self.point_sources[k], regime)
        q = np.maximum.accumulate(q, axis=-1)  # upper quantiles at least the point, which stays as chosen
        return last[:, None, None] + scale[:, None, None] * q

    def predict(self, batch: ForecastInput) -> Forecast:
        """Forecast at ``batch.leads`` (steps of ``batch.step_seconds``).

        A window sampled more often than the task's step is averaged into blocks
        of that step first; leads between the trained ones are interpolated
        (lead 0 being the last value; :func:`interpolate_leads`). Horizons beyond
        the longest trained lead are refused rather than extrapolated.
        """
        k, spec, factor = self.task_for(batch.metric, batch.step_seconds)
        values = batch.values * factor
        cov = batch.covariates if batch.covariates is not None and len(spec.covariates) else None
        ratio = spec.step_seconds / batch.step_seconds
        if ratio < 0.67:
            raise ValueError(f"{batch.metric}: window sampled every {batch.step_seconds:g} s, coarser than the "
                             f"model's step of {spec.step_seconds:g} s")
        block = int(round(ratio))
        if block > 1:
            values = block_mean(values, block)
            cov = None if cov is None else np.stack([block_mean(cov[..., c], block)
                                                     for c in range(cov.shape[-1])], -1)
        leads = np.asarray(batch.leads, dtype=float) * batch.step_seconds / spec.step_seconds
        too_far = leads > max(spec.leads) * 1.0001
        if too_far.any():
            raise ValueError(f"{batch.metric}: trained for leads up to {max(spec.leads)} steps of "
                             f"{spec.step_seconds:g} s ({max(spec.leads) * spec.step_seconds:g} s); asked for "
                             f"{batch.leads[int(np.argmax(too_far))] * batch.step_seconds:g} s")
        graphs = batch.graphs if self.workload_tasks[k] else None  # a task never trained with a known workload
        q = self.predict_task(k, spec, values, cov, *self._workloads(graphs, len(values)))

        out = interpolate_leads(last_observed(values), q, spec.leads, leads, self.short_lead_exponents[k]) / factor
        return Forecast(point=out[..., 0], quantiles=out, leads=batch.leads, quantile_levels=self.quantile_levels)


class OnnxForecaster(TrainedForecaster):
    """A ``dprobe.onnx`` export run with ONNX Runtime: the same forecasts without torch."""

    def __init__(self, path: str | Path, threads: int = 1) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        meta = self.session.get_modelmeta().custom_metadata_map.get("dprobe")
        if meta is None:
            raise ValueError(f"{path}: an ONNX model without dprobe metadata (not exported by dprobe)")
        meta = json.loads(meta)
        if meta.get("kind") != KIND or meta.get("format") != FORMAT:
            raise ValueError(f"{path}: kind {meta.get('kind')!r} format {meta.get('format')!r} is not "
                             f"{KIND!r} format {FORMAT}")
        self._setup(meta)

    def _network(self, x: np.ndarray, stats: np.ndarray, task: np.ndarray, cond: np.ndarray | None = None,
                 known: np.ndarray | None = None) -> np.ndarray:
        feed = {"x": x, "stats": stats, "task": task}
        if self.workload_inputs:  # an export with workload inputs: zeros and known = 0 for unknown workloads
            feed["cond"] = cond if cond is not None else np.zeros((len(x), self._token_length()), dtype=np.float32)
            feed["known"] = known if known is not None else np.zeros(len(x), dtype=np.float32)
        return self.session.run(None, feed)[0]


def interpolate_leads(last: np.ndarray, q: np.ndarray, trained: tuple[int, ...], leads: np.ndarray,
                      exponent: float = 1.0) -> np.ndarray:
    """Quantiles ``(B, len(leads), Q)`` at any ``leads`` (in the task's steps, up to the longest trained one)
    from ``q`` ``(B, H, Q)`` at the ``trained`` leads, the p50 first, and the ``last`` value (lead 0).

    Between trained leads, linearly. Below the first trained lead L, the p50 goes linearly from the
    last value, and the other quantiles keep their distance to it at L times ``(lead / L) ** exponent``:
    ``exponent`` 1 is linear too, 0.5 widens them as a random walk's spread grows (the square root).
    """
    grid = np.array([0.0, *trained])
    full = np.concatenate([np.repeat(last[:, None, None], q.shape[2], axis=2), q], axis=1)  # (B, 1+H, Q)
    out = np.empty((len(last), len(leads), q.shape[2]))
    for j, lead in enumerate(leads):
        hi = int(np.searchsorted(grid, lead - 1e-9))
        hi = min(max(hi, 1), len(grid) - 1)
        w = (lead - grid[hi - 1]) / (grid[hi] - grid[hi - 1])
        out[:, j] = (1 - w) * full[:, hi - 1] + w * full[:, hi]
        if hi == 1 and exponent != 1.0:
            out[:, j] = out[:, j, :1] + w**exponent * (q[:, 0] - q[:, 0, :1])
    return np.sort(out, axis=-1)


def block_mean(values: np.ndarray, block: int) -> np.ndarray:
    """Average the newest ``block``-sized groups of steps: ``(B, L)`` -> ``(B, L // block)`` (NaN-aware)."""
    n = values.shape[1] // block
    if n == 0:
        return np.full((len(values), 1), np.nan)
    tail = values[:, values.shape[1] - n * block :].reshape(len(values), n, block)
    counts = (~np.isnan(tail)).sum(axis=2)
    sums = np.nansum(tail, axis=2)
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
