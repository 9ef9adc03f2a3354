"""The rolling-origin harness and the metrics, on synthetic series whose errors are known by hand."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from dprobe.core import metrics
from dprobe.core.split import Split
from dprobe.data import SeriesDataset
from dprobe.evaluation import EvalConfig, EvalResult, evaluate_dataset
from dprobe.evaluation.report import markdown_table
from dprobe.evaluation.scoring import against_baselines
from dprobe.forecaster import BASELINES, QUANTILES, Forecast, ForecastInput

N = 200  # points per series
TEST_START = 140  # int(200 * 0.7): the default split's test start
LEADS = (1, 2)


def ramp_dataset(n: int = N, extra_short: bool = False, gap_at: int | None = None) -> SeriesDataset:
    """Two ramps of slope 1 (``a``: y = t, ``b``: y = 1000 + t), one minute apart, covariate c = 10 t."""
    t = np.arange(n)
    start = pd.Timestamp("2026-01-01")
    parts = []
    for uid, offset in (("a", 0.0), ("b", 1000.0)):
        y = offset + t.astype(float)
        if gap_at is not None and uid == "a":
            y[gap_at] = np.nan
        parts.append(pd.DataFrame({"unique_id": uid, "ds": start + pd.to_timedelta(t, unit="min"),
                                   "y": y, "c": 10.0 * t}))
    if extra_short:  # too short to evaluate (min_length 100)
        parts.append(pd.DataFrame({"unique_id": "short", "ds": start + pd.to_timedelta(np.arange(50), unit="min"),
                                   "y": np.arange(50.0), "c": 0.0}))
    frame = pd.concat(parts, ignore_index=True)
    frame["gap"] = frame["y"].isna()
    return SeriesDataset(name="ramps", frame=frame, targets=["y"], covariates=["c"],
                         freq=pd.Timedelta(minutes=1), lead_steps=LEADS, season_length=10)


def rows_by(result: EvalResult, method: str) -> dict[int, dict]:
    return {r["lead_steps"]: r for r in result.rows if r["method"] == method}


class WindowLast:
    """A fake forecaster: the window's last value, quantiles point + (0, 1, 2); records what it was given."""

    name = "dprobe"
    context_length = 16

    def __init__(self) -> None:
        self.batches: list[ForecastInput] = []

    def predict(self, batch: ForecastInput) -> Forecast:
        self.batches.append(batch)
        last = batch.values[:, -1]
        point = np.repeat(last[:, None], len(batch.leads), axis=1)
        quantiles = point[:, :, None] + np.array([0.0, 1.0, 2.0])[None, None, :]
        return Forecast(point=point, quantiles=quantiles, leads=batch.leads)


@pytest.fixture(scope="module")
def ramp_result() -> EvalResult:
    return evaluate_dataset(ramp_dataset(extra_short=True), cfg=EvalConfig(progress=False))


# --- metrics -----------------------------------------------------------------------------------------------


def test_mae_and_mase_scale() -> None:
    assert metrics.mae(np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.0, 0.0])) == pytest.approx(4 / 3)
    assert metrics.mase_scale(np.array([0.0, 1.0, 3.0, 6.0])) == pytest.approx(2.0)  # mean |diff| of 1, 2, 3
    assert metrics.mase_scale(np.array([0.0, np.nan, 2.0])) == pytest.approx(2.0)
    assert np.isnan(metrics.mase_scale(np.full(5, 3.0)))  # never moves
    assert np.isnan(metrics.mase_scale(np.array([1.0])))


def test_pinball_by_hand() -> None:
    actual = np.array([1.0, 3.0])
    q = np.array([[2.0, 4.0], [2.0, 2.0]])  # levels 0.5 and 0.9
    # row 1: 0.5 * 1 (over by 1), 0.1 * 3 (over by 3); row 2: 0.5 * 1 (under by 1), 0.9 * 1 (under by 1)
    assert metrics.pinball(actual, q, (0.5, 0.9)) == pytest.approx((0.5 + 0.3 + 0.5 + 0.9) / 4)
    assert metrics.pinball(actual, np.stack([actual, actual], axis=1), (0.5, 0.9)) == 0.0


def test_coverage_by_hand() -> None:
    actual = np.array([1.0, 2.0, 3.0, 4.0])
    assert metrics.coverage(actual, np.array([1.0, 1.0, 5.0, 3.0])) == 0.5  # equal counts as covered
    assert metrics.coverage(actual, actual + 1) == 1.0


# --- the harness with the baselines ------------------------------------------------------------------------


def test_rows_shape(ramp_result: EvalResult) -> None:
    assert ramp_result.dataset == "ramps"
    assert {r["method"] for r in ramp_result.rows} == set(BASELINES)
    assert len(ramp_result.rows) == len(BASELINES) * len(LEADS)
    for r in ramp_result.rows:
        assert {"method", "target", "lead_steps", "mae", "mase", "pinball", "coverage_p90", "n_forecasts"} <= set(r)
        assert r["target"] == "y" and r["horizon_seconds"] == 60.0 * r["lead_steps"]
        assert r["n_series"] == 2  # the 50-point series is skipped
    assert set(ramp_result.seconds) == set(BASELINES)
    assert all(s >= 0 for s in ramp_result.seconds.values())
    out = ramp_result.to_json()
    assert set(out) == {"dataset", "rows", "against_baselines", "seconds"}
    assert out["against_baselines"] == []  # no dprobe rows to compare


def test_last_value_on_ramp(ramp_result: EvalResult) -> None:
    """On y = t the last value misses by exactly h; the naive 1-step error is 1, so MASE = h."""
    rows = rows_by(ramp_result, "last_value")
    for h in LEADS:
        r = rows[h]
        assert r["mae"] == pytest.approx(h)
        assert r["mase"] == pytest.approx(h)
        # origins 140 .. 199 - h in each of the two series
        assert r["n_forecasts"] == 2 * (N - h - TEST_START)
        # the realised errors are always h, so the quantiles are exact: no pinball loss, full coverage
        assert r["pinball"] == pytest.approx(0.0, abs=1e-9)
        assert r["coverage_p90"] == 1.0 and r["coverage_p99"] == 1.0


def test_other_baselines_on_ramp(ramp_result: EvalResult) -> None:
    # seasonal naive (m=10) forecasts y[t + h - 10]: always 10 behind
    for r in rows_by(ramp_result, "seasonal_naive").values():
        assert r["mae"] == pytest.approx(10.0) and r["mase"] == pytest.approx(10.0)
    # window-30 mean and median of t-29..t are t - 14.5
    for name in ("moving_average", "moving_median"):
        for h, r in rows_by(ramp_result, name).items():
            assert r["mae"] == pytest.approx(h + 14.5)
    # EWMA (alpha 0.3) lags a unit ramp by (1 - alpha) / alpha after a long history
    for h, r in rows_by(ramp_result, "ewma").items():
        assert r["mae"] == pytest.approx(h + 0.7 / 0.3, abs=1e-6)
    # ETS extrapolates the line
    for r in rows_by(ramp_result, "ets").values():
        assert r["mae"] < 0.05
    n = {r["method"]: r["n_forecasts"] for r in ramp_result.rows if r["lead_steps"] == 1}
    assert len(set(n.values())) == 1  # every method scored on the same origins


def test_unobserved_actual_is_not_scored() -> None:
    result = evaluate_dataset(ramp_dataset(gap_at=170), cfg=EvalConfig(progress=False, baselines=["last_value"]))
    for h, r in rows_by(result, "last_value").items():
        assert r["n_forecasts"] == 2 * (N - h - TEST_START) - 1


def test_test_fraction_and_baseline_subset() -> None:
    cfg = EvalConfig(progress=False, split=Split().with_test_fraction(0.5), baselines=["last_value", "ets"])
    result = evaluate_dataset(ramp_dataset(), cfg=cfg)
    assert {r["method"] for r in result.rows} == {"last_value", "ets"}
    assert rows_by(result, "last_value")[2]["n_forecasts"] == 2 * (N - 2 - 100)


def test_one_split_cuts_series_as_training_and_evaluation_did() -> None:
    """The split's indices are those the data module (``int(n * test_start)``) and the harness
    (``floor(n * (1 - test_fraction))``) computed apart: the same test span for every length."""
    for fraction in (0.3, 0.2, 0.25, 0.1, 0.5, 0.37):
        split = Split().with_test_fraction(fraction)
        for n in range(1, 5000):
            assert split.test_index(n) == int(np.floor(n * (1 - fraction)))
    split = Split()
    assert (split.validation_start, split.test_start) == (0.6, 0.7)
    for n in range(1, 5000):
        assert (split.validation_index(n), split.test_index(n)) == (int(n * 0.6), int(n * 0.7))
    # origins forecasting up to 5 steps ahead: training ones end before 60, validation ones before 70
    train, valid = split.fit_origins(np.arange(100), 100, 5)
    assert (train.min(), train.max(), valid.min(), valid.max()) == (0, 54, 60, 64)
    # what a checkpoint records, and what one that records nothing was trained with
    assert Split.from_dict(Split(0.5, 0.8).to_dict()) == Split(0.5, 0.8) and Split.from_dict(None) == Split()
    assert Split(0.6, 0.8).reaches_into(Split()) and not Split().reaches_into(Split())
    assert not Split().reaches_into(Split().with_test_fraction(0.2))
    with pytest.raises(ValueError, match="validation_start <= test_start"):
        Split(validation_start=0.8, test_start=0.7)
    assert EvalConfig().split == Split()


# --- a forecaster passed as a model ------------------------------------------------------------------------


def test_fake_forecaster_gets_the_right_windows() -> None:
    model = WindowLast()
    cfg = EvalConfig(progress=False, baselines=["last_value"], batch_size=50)
    result = evaluate_dataset(ramp_dataset(), models={"dprobe": model}, cfg=cfg)
    mine, base = rows_by(result, "dprobe"), rows_by(result, "last_value")
    assert set(mine) == set(LEADS)
    for h in LEADS:
        assert mine[h]["mae"] == base[h]["mae"] == pytest.approx(h)
        assert mine[h]["mase"] == pytest.approx(base[h]["mase"])
        assert mine[h]["n_forecasts"] == base[h]["n_forecasts"]
    # quantiles point + (0, 1, 2) against an actual point + h, at levels 0.5, 0.9, 0.99
    assert QUANTILES == (0.5, 0.9, 0.99)
    assert mine[1]["pinball"] == pytest.approx((0.5 * 1 + 0 + 0.01 * 1) / 3)
    assert mine[2]["pinball"] == pytest.approx((0.5 * 2 + 0.9 * 1 + 0) / 3)
    assert mine[1]["coverage_p90"] == 1.0 and mine[2]["coverage_p90"] == 0.0
    assert "dprobe" in result.seconds
    # the windows: 16 long, ending at each origin, in batches of at most 50
    values = np.concatenate([b.values for b in model.batches])
    covs = np.concatenate([b.covariates for b in model.batches])
    assert all(len(b.values) <= 50 for b in model.batches) and len(model.batches) > 2
    n_origins = N - min(LEADS) - TEST_START  # origins 140..198 per series
    assert values.shape == (2 * n_origins, 16) and covs.shape == (2 * n_origins, 16, 1)
    origins = np.arange(TEST_START, N - 1)
    expected_a = origins[:, None] + np.arange(-15, 1)[None, :]
    expected = np.concatenate([expected_a, 1000.0 + expected_a])
    np.testing.assert_array_equal(values, expected)
    np.testing.assert_array_equal(covs[:, :, 0], 10.0 * np.concatenate([expected_a, expected_a]))
    b0 = model.batches[0]
    assert b0.metric == "y" and b0.leads == LEADS and b0.step_seconds == 60.0


def test_fake_forecaster_short_history_is_padded() -> None:
    """A context longer than the history is padded with NaN in front."""
    model = WindowLast()
    model.context_length = 180
    evaluate_dataset(ramp_dataset(), models={"dprobe": model}, cfg=EvalConfig(progress=False, baselines=[]))
    first = model.batches[0].values[0]  # series a, origin 140: 39 NaN then 0..140
    assert np.isnan(first[:39]).all()
    np.testing.assert_array_equal(first[39:], np.arange(141.0))


def test_markdown_report(ramp_result: EvalResult) -> None:
    text = markdown_table(ramp_result)
    assert text.startswith("### ramps")
    for name in BASELINES:
        assert f"| {name} |" in text
    assert "**" in text and "Time per method" in text


def test_summary_against_the_best_baseline_of_each_row() -> None:
    rows = [{"method": "dprobe", "target": "y", "lead_steps": 1, "mae": 2.0, "pinball": 0.5, "coverage_p90": 0.9,
             "coverage_p99": 0.99},
            {"method": "ewma", "target": "y", "lead_steps": 1, "mae": 4.0, "pinball": 0.4},
            {"method": "ets", "target": "y", "lead_steps": 1, "mae": 2.5, "pinball": 1.0},
            {"method": "ets", "target": "z", "lead_steps": 1, "mae": 1.0, "pinball": 1.0}]  # dprobe not scored on z
    (row,) = against_baselines(rows)
    assert row["mae_ratio"] == pytest.approx(0.8) and row["best_mae"] == "ets"
    assert row["pinball_ratio"] == pytest.approx(1.25) and row["best_pinball"] == "ewma"
    assert (row["coverage_p90"], row["coverage_p99"]) == (0.9, 0.99)
    assert against_baselines(rows[1:]) == []
    # in the report, beside the full table
    cfg = EvalConfig(progress=False, baselines=["last_value", "ewma"])
    text = markdown_table(evaluate_dataset(ramp_dataset(), models={"dprobe": WindowLast()}, cfg=cfg))
    summary = text.split("dprobe against the best baseline of each row")[1]
    for h in LEADS:  # the fake model is the last value: MAE level with it
        assert re.search(rf"\| y \| {h} \| 1\.00 \| last_value \|", summary)


def test_json_report_is_strict_json():
    import json

    from dprobe.evaluation.scoring import EvalResult

    result = EvalResult(dataset="d", rows=[{"method": "m", "mae": float("nan"), "mase": float("inf"), "n": 3}])
    text = json.dumps(result.to_json(), allow_nan=False)
    assert json.loads(text)["rows"][0] == {"method": "m", "mae": None, "mase": None, "n": 3}
