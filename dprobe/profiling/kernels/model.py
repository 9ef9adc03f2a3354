"""Per-kernel efficiency from a GPU's spec sheet: latency = launch overhead + roofline time / efficiency.

The roofline time of a call is ``max(FLOPs / peak, bytes / bandwidth)`` on the GPU's spec. What a
spec sheet does not say (how much of the peak a kernel of this kind and shape reaches: wave quantisation
over the SMs, tiles too small to fill them, caches) is learnt as the log of ``(latency - overhead) /
roofline`` from features that carry over between GPUs: ratios of the call's size to the GPU's (waves of
tiles per SM, bytes per L2, arithmetic intensity per machine balance), never the GPU's name. The launch
overhead of one eager call is the host's as much as the GPU's: an input (measured with one empty call),
else the median of the GPUs the model was fitted on.

The p90 is the p50 times a factor learnt by leaving each fitting GPU out in turn, so that it is the
spread on a GPU the model never saw. :func:`predict_kernel_latency` is the one entry point; the
cross-validation (:func:`crossval`) and ``benchmarks/kernel_efficiency.py`` call it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dprobe.profiling.coldstart.gpus import GPUSpec
from dprobe.profiling.kernels.data import GEMM_OPS, OPS

DEFAULT_MODEL = Path(__file__).with_name("default_kernels.json")
TILES = ((64, 64), (128, 64), (128, 128), (256, 128))  # GEMM tile shapes whose waves are features
FLOOR_QUANTILE = 0.01  # a GPU's launch overhead: this quantile of its calls' latencies
BOOST_ROUNDS = 300
PARAMS = {"objective": "l2", "learning_rate": 0.05, "num_leaves": 31, "min_data_in_leaf": 50, "verbose": -1,
          "num_threads": 2, "seed": 0, "deterministic": True}


def _log(x: np.ndarray | pd.Series) -> np.ndarray:
    return np.log(np.asarray(x, dtype=float))


def roofline_seconds(calls: pd.DataFrame, spec: GPUSpec) -> np.ndarray:
    """``max(FLOPs / fp32 peak, bytes / bandwidth)`` of each call on ``spec``."""
    return np.maximum(calls["flops"].to_numpy() / spec.peak_flops_fp32, calls["bytes"].to_numpy() / spec.bandwidth)


def features(calls: pd.DataFrame, spec: GPUSpec, overhead_s: float) -> pd.DataFrame:
    """The model's inputs: the op kind and ratios of the call's size to the GPU's."""
    op = calls["op"].to_numpy()

    def shape(column: str) -> np.ndarray:  # 1 where the call has no such dimension (None, NaN or no column)
        if column not in calls:
            return np.ones(len(calls))
        return pd.to_numeric(calls[column], errors="coerce").fillna(1).to_numpy(dtype=float)

    b, m, n, k, h = (shape(c) for c in ("B", "M", "N", "K", "H"))
    gemm = np.isin(op, GEMM_OPS)
    rows = np.where(op == "linear", b * m, m)
    batch = np.where(op == "bmm", b, 1.0)
    flops = calls["flops"].to_numpy(dtype=float)
    moved = calls["bytes"].to_numpy(dtype=float)
    sms = max(spec.sm_count, 1)
    balance = spec.peak_flops_fp32 / spec.bandwidth
    roof = roofline_seconds(calls, spec)
    out = {
        "op": pd.Categorical(op, categories=OPS).codes,
        "intensity": _log((flops + 1) / moved),
        "balance": _log((flops + 1) / moved / balance),
        "l2": _log(moved / max(spec.l2_bytes, 1.0)),
        "roof_over_overhead": _log(roof / overhead_s),
        "elements_per_sm": np.where(gemm | (op == "conv"), np.nan, _log(b * h / sms / 2048)),
        "k": np.where(gemm, _log(k), np.nan),
        "rows": np.where(gemm, _log(rows), np.nan),
        "cols": np.where(gemm, _log(n), np.nan),
        "cores": np.full(len(calls), np.log(sms * 64.0)),
    }
    for tm, tn in TILES:
        waves = np.where(gemm, np.ceil(rows / tm) * np.ceil(n / tn) * batch / sms, np.nan)
        out[f"waves_{tm}x{tn}"] = np.log(waves)
        out[f"wave_fill_{tm}x{tn}"] = waves / np.ceil(waves)
    return pd.DataFrame(out)


def launch_overhead(latency_s: pd.Series) -> float:
    """A GPU's launch overhead from its measured calls: the 1st percentile of their latencies."""
    return float(np.quantile(latency_s, FLOOR_QUANTILE))


def _target(calls: pd.DataFrame, spec: GPUSpec, overhead_s: float) -> np.ndarray:
    lat = calls["latency_s"].to_numpy(dtype=float)
    return np.log(np.maximum(lat - overhead_s, 0.05 * lat) / roofline_seconds(calls, spec))


@dataclass
class KernelModel:
    """A fitted efficiency model: the booster (LightGBM's text), the default launch overhead and the p90's
    factor on an unseen GPU."""

    booster_text: str
    overhead_s: float
    p90_factor: float
    gpus: tuple[str, ...]

    def __post_init__(self) -> None:
        import lightgbm as lgb

        self._booster = lgb.Booster(model_str=self.booster_text)

    def log_efficiency(self, calls: pd.DataFrame, spec: GPUSpec, overhead_s: float) -> np.ndarray:
        return self._booster.predict(features(calls, spec, overhead_s))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"format": "dprobe-kernels/1", "overhead_s": self.overhead_s,
                                          "p90_factor": self.p90_factor, "gpus": list(self.gpus),
                                          "booster": self.booster_text}))

    @classmethod
    def load(cls, path: str | Path = DEFAULT_MODEL) -> KernelModel:
        """A model saved by :meth:`save` (plain JSON and LightGBM's text format: nothing is unpickled)."""
        data = json.loads(Path(path).read_text())
        if data.get("format") != "dprobe-kernels/1":
            raise ValueError(f"{path}: not a dprobe kernel model (format {data.get('format')!r})")
        return cls(data["booster"], float(data["overhead_s"]), float(data["p90_factor"]), tuple(data["gpus"]))


def _fit_booster(calls: pd.DataFrame, specs: dict[str, GPUSpec], overheads: dict[str, float]) -> str:
    import lightgbm as lgb

    xs, ys = [], []
    for gpu, part in calls.groupby("gpu", sort=True):
        xs.append(features(part, specs[gpu], overheads[gpu]))
        ys.append(_target(part, specs[gpu], overheads[gpu]))
    data = lgb.Dataset(pd.concat(xs, ignore_index=True), np.concatenate(ys), categorical_feature=["op"])
    return lgb.train(PARAMS, data, BOOST_ROUNDS).model_to_string()


def _weighted_p90(ratios: list[np.ndarray]) -> float:
    """The p90 of held-out log ratios, each left-out group weighed alike, as a factor (at least 1)."""
    values = np.concatenate(ratios)
    weights = np.concatenate([np.full(len(r), 1.0 / len(r)) for r in ratios])
    order = np.argsort(values)
    cum = np.cumsum(weights[order]) / weights.sum()
    return float(np.exp(max(values[order][min(np.searchsorted(cum, 0.9), len(values) - 1)], 0.0)))


def fit(calls: pd.DataFrame, specs: dict[str, GPUSpec], p90_factor: float = 1.0) -> KernelModel:
    """Fit on every GPU of ``calls``; the p90 is the p50 times ``p90_factor`` (see :func:`crossval`)."""
    overheads = {gpu: launch_overhead(part["latency_s"]) for gpu, part in calls.groupby("gpu")}
    return KernelModel(_fit_booster(calls, specs, overheads), float(np.median(list(overheads.values()))),
                       p90_factor, tuple(sorted(calls["gpu"].unique())))


_DEFAULT: KernelModel | None = None


def default_model() -> KernelModel:
    """The model shipped with dprobe (fitted on every bundled GPU by ``python -m dprobe.profiling.kernels``)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = KernelModel.load(DEFAULT_MODEL)
    return _DEFAULT


def predict_kernel_latency(calls: pd.DataFrame, spec: GPUSpec, *, model: KernelModel | None = None,
                           launch_overhead_s: float | None = None) -> pd.DataFrame:
    """p50 and p90 latency (s) of each call (``op``, shapes, ``flops``, ``bytes``) on the GPU ``spec``.

    ``launch_overhead_s``: the host's cost of one eager call on that GPU, if measured; else the fitted
    GPUs' median. Also returns ``roofline_s``, the rule this model replaces.
    """
    model = model or default_model()
    overhead = model.overhead_s if launch_overhead_s is None else float(launch_overhead_s)
    if not overhead > 0:
        raise ValueError(f"launch overhead must be positive, not {launch_overhead_s!r}")
    roof = roofline_seconds(calls, spec)
    p50 = overhead + roof * np.exp(model.log_efficiency(calls, spec, overhead))
    return pd.DataFrame({"p50": p50, "p90": p50 * model.p90_factor, "roofline_s": roof}, index=calls.index)


@dataclass(frozen=True)
class FoldResult:
    """One GPU family left out: median and mean absolute relative error of the model's p50 and of the
    rules, the p90's coverage, per op kind too."""

    family: str
    calls: int
    median_error: float
    mean_error: float
    median_error_measured_overhead: float
    roofline_median_error: float
    roofline_overhead_median_error: float
    p90_coverage: float
    per_op: dict[str, float]


def held_out_ratios(calls: pd.DataFrame, specs: dict[str, GPUSpec]) -> dict[str, tuple[KernelModel, pd.DataFrame]]:
    """Each GPU family left out in turn: the model fitted without it and its calls with the model's p50."""
    out = {}
    for family in sorted(calls["family"].unique()):
        model = fit(calls[calls["family"] != family], specs)
        parts = []
        for gpu, part in calls[calls["family"] == family].groupby("gpu"):
            pred = predict_kernel_latency(part, specs[gpu], model=model)
            measured = predict_kernel_latency(part, specs[gpu], model=model,
                                              launch_overhead_s=launch_overhead(part["latency_s"]))
            parts.append(part.assign(p50=pred["p50"], roofline_s=pred["roofline_s"],
                                     p50_measured_overhead=measured["p50"]))
        out[family] = (model, pd.concat(parts))
    return out


def crossval(calls: pd.DataFrame, specs: dict[str, GPUSpec]) -> list[FoldResult]:
    """Leave-one-GPU-family-out: fit on the others, predict the left-out GPU from its spec sheet alone
    (the fitted GPUs' overhead) and with its measured launch overhead; the rules beside it: the roofline
    alone, and the roofline plus the overhead. A fold's p90 factor comes from the other folds' held-out
    errors, never its own."""
    folds = held_out_ratios(calls, specs)
    ratios = {f: np.log(part["latency_s"].to_numpy() / part["p50"].to_numpy()) for f, (_, part) in folds.items()}
    results = []
    for family, (model, part) in folds.items():
        lat = part["latency_s"].to_numpy()
        e = np.abs(part["p50"].to_numpy() / lat - 1)
        p90 = part["p50"].to_numpy() * _weighted_p90([r for f, r in ratios.items() if f != family])
        o = part["op"].to_numpy()
        results.append(FoldResult(
            family, len(e), float(np.median(e)), float(np.mean(e)),
            float(np.median(np.abs(part["p50_measured_overhead"].to_numpy() / lat - 1))),
            float(np.median(np.abs(part["roofline_s"].to_numpy() / lat - 1))),
            float(np.median(np.abs((part["roofline_s"].to_numpy() + model.overhead_s) / lat - 1))),
            float(np.mean(lat <= p90)),
            {op: float(np.median(e[o == op])) for op in OPS if (o == op).any()}))
    return results


def fit_shipped(calls: pd.DataFrame, specs: dict[str, GPUSpec]) -> KernelModel:
    """The shipped model: fitted on every GPU, its p90 factor from every family's held-out errors."""
    folds = held_out_ratios(calls, specs)
    factor = _weighted_p90([np.log(part["latency_s"].to_numpy() / part["p50"].to_numpy())
                            for _, part in folds.values()])
    return fit(calls, specs, p90_factor=factor)


__all__ = ["FoldResult", "KernelModel", "crossval", "default_model", "features", "fit", "fit_shipped",
           "held_out_ratios", "launch_overhead",
           "predict_kernel_latency", "roofline_seconds"]
