"""Baseline forecast paths and conformal quantiles on tiny series worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from dprobe.forecaster import BASELINES, QUANTILES, Forecast, Forecaster, ForecastInput, make_baseline
from dprobe.forecaster.baselines import (
    MIN_RESIDUALS,
    conformal_quantiles,
    ets_path,
    ets_point_forecasts,
    ewma_path,
    ffill,
    last_value_path,
    moving_average_path,
    moving_median_path,
    seasonal_naive_path,
)

NAN = np.nan
Y = np.array([[1.0, 5.0, 2.0, 8.0, 3.0, 9.0, 4.0]])  # one series, positions 0..6


def test_ffill() -> None:
    got = ffill(np.array([[NAN, 1.0, NAN, NAN, 4.0, NAN]]))
    np.testing.assert_array_equal(got, [[NAN, 1.0, 1.0, 1.0, 4.0, 4.0]])


def test_last_value() -> None:
    path = last_value_path(Y, (1, 2))
    assert path.shape == (1, 7, 2)
    np.testing.assert_array_equal(path[0, :, 0], Y[0])
    np.testing.assert_array_equal(path[0, :, 1], Y[0])
    # gaps are carried forward, never interpolated
    gappy = np.array([[1.0, NAN, NAN, 4.0]])
    np.testing.assert_array_equal(last_value_path(gappy, (1,))[0, :, 0], [1.0, 1.0, 1.0, 4.0])


def test_seasonal_naive_m3() -> None:
    """With m=3 the forecast of y[t+h] is y[t+h-3*ceil(h/3)]: h=1 -> y[t-2], h=2 -> y[t-1], h=3 -> y[t], h=4 -> y[t-2]."""
    path = seasonal_naive_path(Y, (1, 2, 3, 4), season_length=3)
    expected = np.array([
        # h=1   h=2   h=3   h=4
        [NAN, NAN, 1.0, NAN],
        [NAN, 1.0, 5.0, NAN],
        [1.0, 5.0, 2.0, 1.0],
        [5.0, 2.0, 8.0, 5.0],
        [2.0, 8.0, 3.0, 2.0],
        [8.0, 3.0, 9.0, 8.0],
        [3.0, 9.0, 4.0, 3.0],
    ])
    np.testing.assert_array_equal(path[0], expected)
    # at the last position (t=6): y[7] <- y[4]=3, y[8] <- y[5]=9, y[9] <- y[6]=4, y[10] <- y[7]... <- y[4]=3
    np.testing.assert_array_equal(path[0, -1], [3.0, 9.0, 4.0, 3.0])


def test_moving_average_window3() -> None:
    path = moving_average_path(Y, (1, 5), window=3)
    expected = [1.0, 3.0, 8 / 3, 5.0, 13 / 3, 20 / 3, 16 / 3]  # fewer than 3 points: mean of what is there
    np.testing.assert_allclose(path[0, :, 0], expected)
    np.testing.assert_allclose(path[0, :, 1], expected)  # flat over leads


def test_moving_median_window3() -> None:
    path = moving_median_path(Y, (1,), window=3)
    np.testing.assert_allclose(path[0, :, 0], [1.0, 3.0, 2.0, 5.0, 3.0, 8.0, 4.0])


def test_ewma_alpha_half() -> None:
    """Weights (1 - alpha)^i on y[t - i], normalised by their sum (pandas ``ewm(adjust=True)``)."""
    y = np.array([[0.0, 4.0, 8.0]])
    path = ewma_path(y, (1, 3), alpha=0.5)
    expected = [0.0, 4 / 1.5, (8 + 0.5 * 4 + 0.25 * 0) / 1.75]
    np.testing.assert_allclose(path[0, :, 0], expected)
    np.testing.assert_allclose(path[0, :, 1], expected)
    # a long constant series stays constant; a long history converges to the recursive EWMA
    rng = np.random.default_rng(0)
    z = rng.normal(size=200)
    s = z[0]
    for v in z[1:]:
        s = 0.5 * v + 0.5 * s
    assert ewma_path(z[None], (1,), alpha=0.5)[0, -1, 0] == pytest.approx(s, abs=1e-9)


def test_ets_straight_line_extrapolates() -> None:
    t = np.arange(60, dtype=float)
    y = (3.0 + 2.0 * t)[None]
    leads = (1, 2, 5)
    path = ets_path(y, leads)
    assert np.isfinite(path).all()
    expected = 3.0 + 2.0 * (t[:, None] + np.asarray(leads)[None, :])
    np.testing.assert_allclose(path[0, 10:], expected[10:], rtol=1e-3, atol=1e-2)


def test_ets_matches_statsforecast() -> None:
    """The forecast from the last position equals statsforecast's own forecast of the fitted model."""
    from statsforecast.ets import ets_f, forecast_ets

    rng = np.random.default_rng(3)
    z = 100 + 0.5 * np.arange(150) + 0.3 * np.cumsum(rng.normal(size=150)) + rng.normal(size=150)
    leads = (1, 2, 3, 4, 5)
    model = ets_f(z, m=1, model="ZZN")
    np.testing.assert_allclose(ets_path(z[None], leads)[0, -1], forecast_ets(model, h=5)["mean"], rtol=1e-9)
    for spec, series in (("AAN", z), ("MMN", np.exp(z / 50))):  # damped trends, additive and multiplicative
        damped = ets_f(series, m=1, model=spec, damped=True)
        np.testing.assert_allclose(ets_point_forecasts(damped, leads)[-1], forecast_ets(damped, h=5)["mean"],
                                   rtol=1e-9)


def test_ets_degenerate_series() -> None:
    const = np.full((1, 40), 7.0)
    np.testing.assert_array_equal(ets_path(const, (1, 3)), np.full((1, 40, 2), 7.0))
    short = np.array([[1.0, 3.0, 2.0]])  # too short to fit: the last value
    np.testing.assert_array_equal(ets_path(short, (2,))[0, :, 0], short[0])
    lead_nan = np.concatenate([[NAN, NAN], np.arange(30.0)])[None]
    path = ets_path(lead_nan, (1,))
    assert np.isnan(path[0, :2]).all() and np.isfinite(path[0, 2:]).all()


@pytest.mark.parametrize("name", BASELINES)
def test_paths_are_causal(name: str) -> None:
    """A path at position t only depends on y[..t] (ETS: parameters fitted on the first ``fit_length`` points)."""
    rng = np.random.default_rng(1)
    y = np.cumsum(rng.normal(size=(2, 120)), axis=1) + 50
    b = make_baseline(name, season_length=7, window=5, alpha=0.3, fit_length=80)
    k = 90
    changed = y.copy()
    changed[:, k:] += rng.normal(scale=10, size=(2, 120 - k))
    np.testing.assert_array_equal(b.path(y, (1, 4))[:, :k], b.path(changed, (1, 4))[:, :k])


def _expected_quantiles(y: np.ndarray, path: np.ndarray, h: int, j: int, t: int, levels, window: int) -> np.ndarray:
    """The definition written out: errors y[s+h] - path[s, h] for s + h <= t, the last ``window`` of them."""
    errors = [y[s + h] - path[s, j] for s in range(max(0, t - h - window + 1), t - h + 1) if s + h <= t]
    errors = [e for e in errors if not np.isnan(e)]
    if len(errors) < MIN_RESIDUALS:
        return np.full(len(levels), path[t, j])
    return np.sort(path[t, j] + np.quantile(errors, levels))


def test_conformal_hand_example() -> None:
    """Zero point forecasts and y = 0..19 at lead 1: at t the known errors are y[1..t]."""
    y = np.arange(20, dtype=float)[None]
    path = np.zeros((1, 20, 1))
    q = conformal_quantiles(y, path, (1,), levels=(0.5, 0.9, 0.99))
    assert q.shape == (1, 20, 1, 3)
    # fewer than MIN_RESIDUALS (10) errors known: quantiles fall back to the point forecast
    np.testing.assert_array_equal(q[0, :10, 0], np.zeros((10, 3)))
    # t=10: errors {1..10}: median 5.5, p90 1 + 0.9 * 9 = 9.1, p99 1 + 0.99 * 9 = 9.91
    np.testing.assert_allclose(q[0, 10, 0], [5.5, 9.1, 9.91])
    # t=19: errors {1..19}
    np.testing.assert_allclose(q[0, 19, 0], [10.0, 17.2, 18.82])
    # a trailing window of 12: at t=15 only errors {4..15}
    q12 = conformal_quantiles(y, path, (1,), levels=(0.5,), window=12)
    assert q12[0, 15, 0, 0] == pytest.approx(9.5)


def test_conformal_matches_definition_and_positions() -> None:
    rng = np.random.default_rng(2)
    y = np.round(rng.normal(size=(2, 60)) * 10)
    y[1, 25] = NAN  # an unobserved actual gives no error
    leads = (1, 3)
    path = last_value_path(y, leads)
    q = conformal_quantiles(y, path, leads, levels=QUANTILES, window=20)
    for b in range(2):
        for j, h in enumerate(leads):
            for t in (12, 20, 30, 59):
                np.testing.assert_allclose(q[b, t, j], _expected_quantiles(y[b], path[b], h, j, t, QUANTILES, 20))
    pos = np.array([30, 59])
    np.testing.assert_array_equal(conformal_quantiles(y, path, leads, window=20, positions=pos), q[:, pos])
    assert (np.diff(q, axis=-1) >= 0).all()  # never cross


def test_conformal_no_look_ahead() -> None:
    """Changing anything after t leaves the quantiles at t unchanged."""
    rng = np.random.default_rng(4)
    y = rng.normal(size=(1, 80))
    t = 50
    later = y.copy()
    later[0, t + 1 :] += 100.0
    leads = (1, 5)
    q1 = conformal_quantiles(y, last_value_path(y, leads), leads)
    q2 = conformal_quantiles(later, last_value_path(later, leads), leads)
    np.testing.assert_array_equal(q1[:, : t + 1], q2[:, : t + 1])
    assert not np.allclose(q1[:, t + 6 :], q2[:, t + 6 :])


def test_conformal_ordering_with_unsorted_levels() -> None:
    y = np.arange(30, dtype=float)[None] % 7
    q = conformal_quantiles(y, np.zeros((1, 30, 1)), (1,), levels=(0.9, 0.1, 0.5))
    assert (np.diff(q, axis=-1) >= 0).all()
    errors = y[0, 1:30]
    np.testing.assert_allclose(q[0, 29, 0], np.sort(np.quantile(errors, (0.9, 0.1, 0.5))))


def test_predict_is_last_position() -> None:
    rng = np.random.default_rng(5)
    values = np.cumsum(rng.normal(size=(3, 50)), axis=1)
    batch = ForecastInput(values=values, metric="gpu_memory_bytes", leads=(1, 4), step_seconds=60.0)
    for name in BASELINES:
        b = make_baseline(name, season_length=5, window=4)
        assert isinstance(b, Forecaster)
        f = b.predict(batch)
        assert isinstance(f, Forecast)
        assert f.point.shape == (3, 2) and f.quantiles.shape == (3, 2, len(QUANTILES))
        assert f.leads == (1, 4)
        np.testing.assert_allclose(f.point, b.path(values, (1, 4))[:, -1])
        assert (np.diff(f.quantiles, axis=-1) >= 0).all()
    f = make_baseline("last_value").predict(batch)
    np.testing.assert_array_equal(f.point, np.repeat(values[:, -1:], 2, axis=1))


def test_make_baseline_and_input_checks() -> None:
    assert set(BASELINES) == {"last_value", "seasonal_naive", "moving_average", "moving_median", "ewma", "ets"}
    with pytest.raises(ValueError, match="unknown baseline"):
        make_baseline("prophet")
    with pytest.raises(ValueError, match="batch, length"):
        ForecastInput(values=np.zeros(5), metric="gpu_demand", leads=(1,), step_seconds=1.0)
    with pytest.raises(ValueError, match="leads"):
        ForecastInput(values=np.zeros((1, 5)), metric="gpu_demand", leads=(0,), step_seconds=1.0)


def test_infinite_values_are_gaps_and_empty_windows_are_refused() -> None:
    """A broken exporter's +Inf is a missing sample, not a level to forecast from."""
    y = np.array([[1.0, 2.0, 3.0, 4.0, 5.0]])
    broken = np.array([[1.0, 2.0, 3.0, 4.0, np.inf]])
    gap = np.array([[1.0, 2.0, 3.0, 4.0, np.nan]])
    f = make_baseline("last_value")
    forecast = f.predict(ForecastInput(values=broken, metric="gpu_memory_bytes", leads=(1,), step_seconds=60))
    assert forecast.point[0, 0] == 4.0 == f.predict(ForecastInput(values=gap, metric="gpu_memory_bytes",
                                                                  leads=(1,), step_seconds=60)).point[0, 0]
    cov = ForecastInput(values=y, metric="m", leads=(1,), step_seconds=60, covariates=np.full((1, 5, 1), -np.inf))
    assert np.isnan(cov.covariates).all()
    with pytest.raises(ValueError, match="at least one time step"):
        ForecastInput(values=np.zeros((2, 0)), metric="gpu_memory_bytes", leads=(1,), step_seconds=60)
