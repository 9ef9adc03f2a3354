"""Per-kernel efficiency from a GPU's spec sheet: latency = launch overhead + roofline time / efficiency.

The roofline time of a call is ``max(FLOPs / peak, bytes / bandwidth)`` on the GPU's spec. What a
spec sheet does not say (how much of the peak a kernel of this kind and shape reaches: wave quantisation
over the SMs, tiles too small to fill them, caches) is learnt as the log of ``(latency - overhead) /
roofline`` from features that carry over between GPUs: ratios of the call's size to the GPU's (waves of
tiles per SM, bytes per L2, arithmetic intensity per machine balance), never the GPU's name. The launch
overhead of one eager call is the host's as much as the GPU's: an input (measured with one empty call),
else the median of the GPUs the model was fitted on.

A **shape-free** variant (``shapes=False``) sees what a replayed kernel has (a ``ReplayOp``: its class,
FLOPs, bytes and element size, no GEMM shapes): the op kind collapsed to the replay's kernel class
(:data:`SHAPE_FREE_CLASS`), elements per SM from bytes over the element size, FLOPs per SM in place of the
tile waves. :func:`replay_op_seconds` puts a replay's kernels on it (the replay roofline's
``roofline="kernel-model"``, :func:`dprobe.profiling.coldstart.features.roofline_seconds`).

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

from dprobe.core.gpus import GPUSpec
from dprobe.profiling.kernels.data import ELEMENTWISE_OPS, FP32_BYTES, GEMM_OPS, OPS

DEFAULT_MODEL = Path(__file__).with_name("default_kernels.json")
SHAPE_FREE_MODEL = Path(__file__).with_name("default_kernels_shapefree.json")
# the shape-free model's op kinds: the replay's kernel classes (memtrack.OP_CLASSES) NeuSight measured
SHAPE_FREE_CLASSES = ("elementwise", "norm", "matmul", "conv")
# a NeuSight op kind or a replay kernel class -> its shape-free class (grouped / depthwise convolutions as
# convolutions, the optimizer's foreach kernels as element-wise ones)
SHAPE_FREE_CLASS = {"bmm": "matmul", "linear": "matmul", "conv": "conv", "ln": "norm", "softmax": "norm",
                    **{op: "elementwise" for op in ELEMENTWISE_OPS if op not in ("ln", "softmax")},
                    **{c: c for c in SHAPE_FREE_CLASSES}, "conv_grouped": "conv", "optimizer": "elementwise"}
TILE_FLOPS = 2.0 * 128 * 128 * 64  # one 128x128 output tile over a K of 64: the shape-free waves' unit
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


def shape_free_class(op: np.ndarray | pd.Series) -> np.ndarray:
    """The shape-free class (:data:`SHAPE_FREE_CLASSES`) of each NeuSight op kind or replay kernel class."""
    unknown = sorted(set(np.asarray(op)) - set(SHAPE_FREE_CLASS))
    if unknown:
        raise ValueError(f"no shape-free class for op {str(unknown[0])!r} (known: {', '.join(SHAPE_FREE_CLASS)})")
    return np.array([SHAPE_FREE_CLASS[o] for o in np.asarray(op)], dtype=object)


def shape_free_features(calls: pd.DataFrame, spec: GPUSpec, overhead_s: float) -> pd.DataFrame:
    """The shape-free model's inputs, from what a replayed kernel has: ``op`` (a NeuSight op kind or a replay
    kernel class), ``flops``, ``bytes`` and optionally ``element_bytes`` (default fp32's 4)."""
    cls = shape_free_class(calls["op"])
    flops = calls["flops"].to_numpy(dtype=float)
    moved = calls["bytes"].to_numpy(dtype=float)
    size = calls["element_bytes"].to_numpy(dtype=float) if "element_bytes" in calls else np.full(len(calls), FP32_BYTES)
    sms = max(spec.sm_count, 1)
    balance = spec.peak_flops_fp32 / spec.bandwidth
    roof = roofline_seconds(calls, spec)
    compute = np.isin(cls, ("matmul", "conv"))
    return pd.DataFrame({
        "op": pd.Categorical(cls, categories=SHAPE_FREE_CLASSES).codes,
        "intensity": _log((flops + 1) / moved),
        "balance": _log((flops + 1) / moved / balance),
        "l2": _log(moved / max(spec.l2_bytes, 1.0)),
        "roof_over_overhead": _log(roof / overhead_s),
        "elements_per_sm": _log(np.maximum(moved / size / sms / 2048, 1e-6)),
        "flop_waves": np.where(compute, _log(np.maximum(flops / TILE_FLOPS / sms, 1e-6)), np.nan),
        "cores": np.full(len(calls), np.log(sms * 64.0)),
    })


def features(calls: pd.DataFrame, spec: GPUSpec, overhead_s: float, shapes: bool = True) -> pd.DataFrame:
    """The model's inputs: the op kind and ratios of the call's size to the GPU's (``shapes=False``:
    :func:`shape_free_features`, without the GEMM shapes)."""
    if not shapes:
        return shape_free_features(calls, spec, overhead_s)
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
    shapes: bool = True  # False: the shape-free variant (:func:`shape_free_features`)

    def __post_init__(self) -> None:
        import lightgbm as lgb

        self._booster = lgb.Booster(model_str=self.booster_text)

    def log_efficiency(self, calls: pd.DataFrame, spec: GPUSpec, overhead_s: float) -> np.ndarray:
        # a plain prediction is an array (lightgbm's type also covers its sparse and per-class results)
        return np.asarray(self._booster.predict(features(calls, spec, overhead_s, self.shapes)))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"format": "dprobe-kernels/1", "overhead_s": self.overhead_s,
                                          "p90_factor": self.p90_factor, "gpus": list(self.gpus),
                                          "shapes": self.shapes, "booster": self.booster_text}))

    @classmethod
    def load(cls, path: str | Path = DEFAULT_MODEL) -> KernelModel:
        """A model saved by :meth:`save` (plain JSON and LightGBM's text format: nothing is unpickled)."""
        data = json.loads(Path(path).read_text())
        if data.get("format") != "dprobe-kernels/1":
            raise ValueError(f"{path}: not a dprobe kernel model (format {data.get('format')!r})")
        return cls(data["booster"], float(data["overhead_s"]), float(data["p90_factor"]), tuple(data["gpus"]),
                   bool(data.get("shapes", True)))


def _fit_booster(calls: pd.DataFrame, specs: dict[str, GPUSpec], overheads: dict[str, float],
                 shapes: bool = True) -> str:
    import lightgbm as lgb

    xs, ys = [], []
    for gpu, part in calls.groupby("gpu", sort=True):
        xs.append(features(part, specs[gpu], overheads[gpu], shapes))
        ys.append(_target(part, specs[gpu], overheads[gpu]))
    data = lgb.Dataset(pd.concat(xs, ignore_index=True), np.concatenate(ys), categorical_feature=["op"])
    return lgb.train(PARAMS, data, BOOST_ROUNDS).model_to_string()


def _weighted_p90(ratios: list[np.ndarray]) -> float:
    """The p90 of held-out log ratios, each left-out group weighed alike, as a factor (at least 1)."""
    values = np.concatenate(ratios)
    weights = np.concatenate([np.full(len(r), 1.0 / len(r)) for r in ratios])
    order = np.argsort(values)
    cum = np.cumsum(weights[order]) / weights.sum()
    return float(np.exp(max(values[order][min(int(np.searchsorted(cum, 0.9)), len(values) - 1)], 0.0)))


def fit(calls: pd.DataFrame, specs: dict[str, GPUSpec], p90_factor: float = 1.0, shapes: bool = True) -> KernelModel:
    """Fit on every GPU of ``calls``; the p90 is the p50 times ``p90_factor`` (see :func:`crossval`);
    ``shapes=False``: the shape-free variant."""
    overheads = {gpu: launch_overhead(part["latency_s"]) for gpu, part in calls.groupby("gpu")}
    return KernelModel(_fit_booster(calls, specs, overheads, shapes), float(np.median(list(overheads.values()))),
                       p90_factor, tuple(sorted(calls["gpu"].unique())), shapes)


_DEFAULT: dict[bool, KernelModel] = {}


def default_model(shapes: bool = True) -> KernelModel:
    """The model shipped with dprobe (fitted on every bundled GPU by ``python -m dprobe.profiling.kernels``);
    ``shapes=False``: the shape-free one."""
    if shapes not in _DEFAULT:
        _DEFAULT[shapes] = KernelModel.load(DEFAULT_MODEL if shapes else SHAPE_FREE_MODEL)
    return _DEFAULT[shapes]


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


def held_out_ratios(calls: pd.DataFrame, specs: dict[str, GPUSpec],
                    shapes: bool = True) -> dict[str, tuple[KernelModel, pd.DataFrame]]:
    """Each GPU family left out in turn: the model fitted without it and its calls with the model's p50."""
    out = {}
    for family in sorted(calls["family"].unique()):
        model = fit(calls[calls["family"] != family], specs, shapes=shapes)
        parts = []
        for gpu, part in calls[calls["family"] == family].groupby("gpu"):
            pred = predict_kernel_latency(part, specs[gpu], model=model)
            measured = predict_kernel_latency(part, specs[gpu], model=model,
                                              launch_overhead_s=launch_overhead(part["latency_s"]))
            parts.append(part.assign(p50=pred["p50"], roofline_s=pred["roofline_s"],
                                     p50_measured_overhead=measured["p50"]))
        out[family] = (model, pd.concat(parts))
    return out


def crossval(calls: pd.DataFrame, specs: dict[str, GPUSpec], shapes: bool = True) -> list[FoldResult]:
    """Leave-one-GPU-family-out: fit on the others, predict the left-out GPU from its spec sheet alone
    (the fitted GPUs' overhead) and with its measured launch overhead; the rules beside it: the roofline
    alone, and the roofline plus the overhead. A fold's p90 factor comes from the other folds' held-out
    errors, never its own. ``shapes=False``: the shape-free variant."""
    folds = held_out_ratios(calls, specs, shapes)
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


def fit_shipped(calls: pd.DataFrame, specs: dict[str, GPUSpec], shapes: bool = True) -> KernelModel:
    """The shipped model: fitted on every GPU, its p90 factor from every family's held-out errors."""
    folds = held_out_ratios(calls, specs, shapes)
    factor = _weighted_p90([np.log(part["latency_s"].to_numpy() / part["p50"].to_numpy())
                            for _, part in folds.values()])
    return fit(calls, specs, p90_factor=factor, shapes=shapes)


def replay_efficiency(ops: np.ndarray, gpu: GPUSpec, op_classes: tuple[str, ...], *,
                      model: KernelModel | None = None) -> np.ndarray:
    """How many times its fp32 roofline ``max(FLOPs / fp32 peak, bytes / bandwidth)`` each replayed kernel
    (rows of ``ReplayOp``: phase, class, low precision, FLOPs, bytes) takes on ``gpu``, by the shape-free
    model (launch cost not included; elements of 2 bytes where the kernel is half precision). NeuSight
    measured fp32 kernels on the vector units: the caller
    (:func:`dprobe.profiling.coldstart.features.op_seconds`) says which kernels the factor applies to.
    ``op_classes``: the names of the replay's class codes (``memtrack.OP_CLASSES``). Identical kernels are
    predicted once, all in one call of the booster."""
    model = model or default_model(shapes=False)
    if model.shapes:
        raise ValueError("replayed kernels have no GEMM shapes: give the shape-free model (shapes=False)")
    ops = np.asarray(ops, dtype=np.float64).reshape(-1, 5)
    if not len(ops):
        return np.zeros(0)
    keys, inverse = np.unique(ops[:, 1:], axis=0, return_inverse=True)
    calls = pd.DataFrame({"op": np.array(op_classes, dtype=object)[keys[:, 0].astype(int)],
                          "flops": keys[:, 2], "bytes": np.maximum(keys[:, 3], 1.0),
                          "element_bytes": np.where(keys[:, 1] > 0, 2.0, FP32_BYTES)})
    return np.exp(model.log_efficiency(calls, gpu, model.overhead_s))[np.ravel(inverse)]


__all__ = ["SHAPE_FREE_CLASS", "SHAPE_FREE_CLASSES", "FoldResult", "KernelModel", "crossval", "default_model",
           "features", "fit", "fit_shipped", "held_out_ratios", "launch_overhead", "predict_kernel_latency",
           "replay_efficiency", "roofline_seconds", "shape_free_class", "shape_free_features"]
