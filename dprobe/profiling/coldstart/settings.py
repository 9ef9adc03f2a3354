"""Settings an inference job runs with beyond the stack's defaults, and how each one's step time is predicted.

- **Memory format** (``channels-last``): the model and its images in ``torch.channels_last``, replayed so
  (:func:`~dprobe.profiling.coldstart.replay.to_channels_last`). On meta tensors the channels-last replay
  records the same kernels, FLOPs and bytes as the channels-first one for nearly every model (NHWC
  changes which cuDNN kernels run and drops their layout transposes, which no meta replay sees), and the
  inference step model learnt from channels-first rows only, so its prediction is corrected by what timm's
  channels-last table measured (``layout``): the **rule**, one factor (the median measured / predicted of
  the fitting rows), or the **model**, that log-factor as a linear function of the roofline's op-class
  shares (convolutions and depthwise convolutions gain from NHWC, element-wise kernels and matrix products
  do not). The one that beat the other on every fifth of the families left out ships (:func:`choose`).
- **Re-parameterisation** (``reparameterize``): the model fused for inference before it is replayed
  (timm's ``reparameterize_model``, :func:`~dprobe.profiling.coldstart.replay.reparameterized`); its
  kernels are the fused model's, no correction.
- **torch.compile** (``compile``): Inductor's generated kernels cannot be replayed on meta tensors, so the
  step is the eager prediction times :data:`COMPILE_FACTOR` with a p90 widened by :data:`COMPILE_P90`:
  a calibration from timm's bf16 ``torch.compile`` inference tables, which are not bundled (nothing here
  validates it), said so in the prediction's note.

``default_settings.json`` beside this module holds the fitted layout correction and its cross-validation;
``benchmarks/predict_settings.py`` fits and scores it (:func:`fit_layout`, :func:`held_out_layout`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

DEFAULT_SETTINGS = Path(__file__).with_name("default_settings.json")
SETTINGS_FORMAT = "dprobe-inference-settings/1"
MEMORY_FORMAT_NAMES = {"channels-first": "nchw", "channels-last": "nhwc", "nchw": "nchw", "nhwc": "nhwc"}
LAYOUT_FEATURES = ("share_conv", "share_conv_grouped", "share_matmul", "share_norm", "share_attention")
LAYOUT_RIDGE = 0.002  # ridge penalty of the layout model's coefficients (not the intercept), in log units
# torch.compile (default mode) against eager: the eager prediction was 1.28x the measured compiled step at the
# median on timm's bf16 torch.compile inference tables (not bundled); the p90 is widened by as much again
COMPILE_FACTOR = 1.0 / 1.28
COMPILE_P90 = 1.28
LAYOUT_METHODS = ("rule", "model")


class SettingsError(ValueError):
    """A settings file that cannot be read (names the file and what is wrong)."""


def memory_format_of(value: str | None) -> str:
    """``nchw`` or ``nhwc`` for a memory format's name (``channels-first`` / ``channels-last`` or the
    short names); a ValueError naming the choices otherwise."""
    name = MEMORY_FORMAT_NAMES.get(str(value).strip().lower().replace("_", "-")) if value is not None else "nchw"
    if name is None:
        raise ValueError(f"--memory-format {value!r}: one of channels-first, channels-last (or nchw, nhwc)")
    return name


@dataclass
class LayoutCorrection:
    """Channels-last against the channels-first prediction: ``log(measured / p50) = intercept + coef .
    shares`` (``method`` ``model``) or ``log(factor)`` (``rule``); ``p90``: the p90 / p50 of the method
    from families left out; ``cv``: the fold-by-fold figures it was chosen on."""

    method: str
    factor: float
    intercept: float
    coef: list[float]
    p90: float
    gpus: list[str]
    rows: int
    cv: dict[str, Any] = field(default_factory=dict)

    def log_factor(self, x: pd.DataFrame, method: str | None = None) -> np.ndarray:
        """log(channels-last step / channels-first p50) of each row of a
        :func:`~dprobe.profiling.coldstart.inference.feature_frame` (``method``: this one's by default)."""
        if (method or self.method) == "rule":
            return np.full(len(x), math.log(self.factor))
        return self.intercept + x[list(LAYOUT_FEATURES)].to_numpy(dtype=float) @ np.asarray(self.coef)


@dataclass
class InferenceSettings:
    """The shipped corrections of :mod:`settings <dprobe.profiling.coldstart.settings>`."""

    layout: LayoutCorrection | None
    compile_factor: float = COMPILE_FACTOR
    compile_p90: float = COMPILE_P90
    # a training step in channels-last: the cold-start checkpoint's (channels-first) step times this factor
    # where it beat the checkpoint on every fold of timm's channels-last training table ({"factor", "p90",
    # "method": "rule" or "proxy", "cv"}); None: not fitted
    train_layout: dict[str, Any] | None = None
    # --reparameterize: the fused replay's step ("fused") where it beat the plain replay's on every family
    # of timm's fused (PyTorch 2.9) tables, else the plain replay's ("proxy"), memory the fused one's either
    # way ({"method", "cv"}); None: not fitted (the fused replay's step)
    reparameterize: dict[str, Any] | None = None

    def save(self, path: str | Path) -> None:
        data = {"format": SETTINGS_FORMAT, "layout_features": list(LAYOUT_FEATURES), **asdict(self)}
        Path(path).write_text(json.dumps(data, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path = DEFAULT_SETTINGS) -> InferenceSettings:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SettingsError(f"{path}: cannot read inference settings: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != SETTINGS_FORMAT:
            raise SettingsError(f"{path}: not dprobe inference settings (format {SETTINGS_FORMAT!r} expected)")
        if data.get("layout_features") != list(LAYOUT_FEATURES):
            raise SettingsError(f"{path}: fitted on other features than this dprobe's: refit it "
                                "(benchmarks/predict_settings.py --write)")
        layout = data.get("layout")
        try:
            lc = LayoutCorrection(**layout) if layout else None
        except TypeError as exc:
            raise SettingsError(f"{path}: layout: {exc}") from exc
        if lc is not None and lc.method not in LAYOUT_METHODS:
            raise SettingsError(f"{path}: layout method {lc.method!r} ({', '.join(LAYOUT_METHODS)})")
        train = data.get("train_layout")
        if train is not None and not (isinstance(train, dict) and train.get("method") in ("rule", "proxy")
                                      and float(train.get("factor", 0)) > 0 and float(train.get("p90", 0)) >= 1):
            raise SettingsError(f"{path}: train_layout needs method rule or proxy, a factor > 0 and a p90 >= 1")
        return cls(layout=lc, compile_factor=float(data.get("compile_factor", COMPILE_FACTOR)),
                   compile_p90=float(data.get("compile_p90", COMPILE_P90)), train_layout=train,
                   reparameterize=data.get("reparameterize"))

    def reparameterized_step(self) -> bool:
        """Whether ``--reparameterize`` takes its step time from the fused replay (else the plain one's)."""
        return not self.reparameterize or self.reparameterize.get("method") == "fused"


_DEFAULT: InferenceSettings | None = None


def default_settings() -> InferenceSettings:
    """The settings shipped with dprobe (``default_settings.json``); none fitted where it is missing."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = InferenceSettings.load() if DEFAULT_SETTINGS.is_file() else InferenceSettings(layout=None)
    return _DEFAULT


@dataclass(frozen=True)
class SettingStep:
    """An inference step under the job's settings: p50 and p90 (seconds), what ran and why."""

    p50: float
    p90: float
    method: str  # the channels-first predictor's method, with "+layout-rule" / "+layout-model" / "+compile-factor"
    notes: tuple[str, ...]


def adjust_frame(x: pd.DataFrame, p50: np.ndarray, p90: np.ndarray, *, memory_format: str = "nchw",
                 compiled: bool = False, settings: InferenceSettings | None = None,
                 layout_method: str | None = None) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """The channels-first predictions ``p50``, ``p90`` of the rows of ``x`` (a
    :func:`~dprobe.profiling.coldstart.inference.feature_frame` of their replays, channels-last ones for
    ``nhwc``) under the settings: the layout correction for ``nhwc`` (``layout_method``: the shipped
    one's by default), torch.compile's factor. Returns p50, p90, the method suffixes and the notes."""
    settings = settings or default_settings()
    p50, p90 = np.asarray(p50, dtype=float).copy(), np.asarray(p90, dtype=float).copy()
    suffixes: list[str] = []
    notes: list[str] = []
    if memory_format_of(memory_format) == "nhwc":
        lc = settings.layout
        if lc is None:
            notes.append("memory format channels-last: replayed channels-last; no layout correction ships, so the "
                         "step is the channels-first model's")
        else:
            method = layout_method or lc.method
            ratio = np.exp(lc.log_factor(x, method))
            p50, p90 = p50 * ratio, p50 * ratio * lc.p90
            suffixes.append(f"layout-{method}")
            figures = (lc.cv.get("mape") or {})
            versus = (f" (families left out, MAPE: channels-first as proxy {figures['proxy']:.1f} %, rule "
                      f"{figures['rule']:.1f} %, model {figures['model']:.1f} %)") if figures else ""
            what = ("one factor" if method == "rule" else "a factor from the op-class shares")
            notes.append(f"memory format channels-last: replayed channels-last, step time corrected by {what} "
                         f"learnt on timm's channels-last table ({', '.join(lc.gpus)}){versus}")
    if compiled:
        p50, p90 = p50 * settings.compile_factor, p90 * settings.compile_factor * settings.compile_p90
        suffixes.append("compile-factor")
        notes.append(f"torch.compile: Inductor's kernels cannot be replayed on meta tensors; the step is the eager "
                     f"prediction x{settings.compile_factor:.2f} (the eager prediction's median over the measured "
                     f"compiled step on timm's bf16 torch.compile tables, not bundled, so not validated here), its "
                     f"p90 widened x{settings.compile_p90:.2f}")
    return p50, p90, suffixes, notes


def predict_setting_step(est: Any, precision: str, gpu: Any, *, memory_format: str = "nchw",
                         compiled: bool = False, model: Any = None,
                         settings: InferenceSettings | None = None) -> SettingStep:
    """p50 and p90 of one inference step of the replay ``est`` (channels-last for ``nhwc``, the fused
    model where re-parameterised) under the settings: the inference step model's prediction
    (:func:`~dprobe.profiling.coldstart.inference.predict_inference_step`) then :func:`adjust_frame`.
    What ``dprobe predict --mode inference`` and ``benchmarks/predict_settings.py`` call."""
    from dprobe.profiling.coldstart.inference import default_model, feature_frame, predict_frame

    model = model or default_model()
    if not est.ops:
        raise ValueError("the replay holds no kernels (an estimate from an older dprobe, without ops?)")
    spec = model.roofline_spec(gpu)
    x = feature_frame([est], precision, spec, model.roofline)
    p50, p90 = predict_frame(x, model=model)
    method, _ = model.explain(gpu)
    p50, p90, suffixes, notes = adjust_frame(x, p50, p90, memory_format=memory_format, compiled=compiled,
                                             settings=settings)
    return SettingStep(float(p50[0]), float(max(p90[0], p50[0])), "+".join([method, *suffixes]), tuple(notes))


def train_layout_step(p50: float, p90: float,
                      settings: InferenceSettings | None = None) -> tuple[float, float, str, str]:
    """A channels-last training step from the checkpoint's channels-first one: p50, p90, the method suffix
    ("" where the checkpoint's own step ships) and the note."""
    lay = (settings or default_settings()).train_layout
    if not lay or lay["method"] != "rule":
        return p50, p90, "", ("memory format channels-last: replayed channels-last (memory and kernels); the step "
                              "time is the checkpoint's, which learnt from channels-first runs only")
    f, widen = float(lay["factor"]), float(lay["p90"])
    mape = (lay.get("cv") or {}).get("mape") or {}
    versus = (f" (families left out, MAPE {mape['rule']:.1f} % against the checkpoint's {mape['proxy']:.1f} %)"
              if mape else "")
    return (p50 * f, max(p90 * f, p50 * f * widen), "layout-rule",
            f"memory format channels-last: replayed channels-last (memory and kernels); step time the "
            f"checkpoint's channels-first step x{f:.3f}, learnt on timm's RTX 3090 channels-last training "
            f"table{versus}")


def fit_layout(x: pd.DataFrame, measured: np.ndarray, p50: np.ndarray) -> tuple[float, float, np.ndarray]:
    """The rule's factor (median measured / p50) and the model's intercept and coefficients (ridge on
    :data:`LAYOUT_FEATURES`, the intercept not penalised) from rows' channels-last measurements against
    their channels-first predictions."""
    y = np.log(np.asarray(measured, dtype=float) / np.asarray(p50, dtype=float))
    a = x[list(LAYOUT_FEATURES)].to_numpy(dtype=float)
    mean_a, mean_y = a.mean(axis=0), y.mean()
    ac = a - mean_a
    coef = np.linalg.solve(ac.T @ ac + LAYOUT_RIDGE * len(y) * np.eye(a.shape[1]), ac.T @ (y - mean_y))
    return float(np.exp(np.median(y))), float(mean_y - mean_a @ coef), coef


def p90_ratio(log_ratios: list[np.ndarray]) -> float:
    """The 90th percentile of held-out log(measured / p50), each group weighed alike, as a factor (>= 1)."""
    from dprobe.profiling.coldstart.inference import p90_factor

    return p90_factor(log_ratios)


def choose(folds: list[dict[str, float]]) -> str:
    """``model`` where its MAPE beat the rule's on every fold, else ``rule``."""
    return "model" if folds and all(f["model"] < f["rule"] for f in folds) else "rule"


__all__ = ["COMPILE_FACTOR", "COMPILE_P90", "DEFAULT_SETTINGS", "LAYOUT_FEATURES", "InferenceSettings",
           "LayoutCorrection", "SettingStep", "SettingsError", "adjust_frame", "choose", "default_settings",
           "fit_layout", "memory_format_of", "p90_ratio", "predict_setting_step", "train_layout_step"]
