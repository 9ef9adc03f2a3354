"""benchmarks/forecast_headroom.py: its reference learner reads only the past (but where it is told the
future on purpose), and its three variants are what they say, on small copies of the bundled data."""

from __future__ import annotations

import numpy as np
import pytest

from dprobe.data.alibaba import load_alibaba
from dprobe.data.helios import load_helios
from dprobe.evaluation import EvalConfig, evaluate_dataset
from dprobe.evaluation.scoring import score


@pytest.fixture(scope="module")
def headroom(script):
    return script("benchmarks/forecast_headroom.py")


def test_features_read_only_the_past_and_the_oracle_reads_the_exogenous_future(headroom, small_alibaba_dir):
    ds = load_alibaba(small_alibaba_dir)
    uid = ds.series_ids[0]
    y = ds.arrays("gpu_duty_cycle_pct")[uid]
    cov = ds.covariate_arrays()[uid]
    t = 700
    changed_y, changed_cov = y.copy(), cov.copy()
    changed_y[t + 1:] = 1e6  # everything after t differs
    changed_cov[t + 1:] = 1e6

    def at_t(values, covariates, future):
        base, anchors, scale = headroom.trailing_features(values, covariates, ds.covariates, ds.season_length, 0.1)
        lead = headroom.lead_features(base, values, covariates, ds.covariates, anchors["last_value"], scale,
                                      ds.season_length, 15, future)
        return lead.iloc[t], {k: a[t] for k, a in anchors.items()}, scale[t]

    before, anchors, scale = at_t(y, cov, future=False)
    after, anchors_after, scale_after = at_t(changed_y, changed_cov, future=False)
    assert before.equals(after) and anchors == anchors_after and scale == scale_after

    oracle, _, _ = at_t(y, cov, future=True)
    oracle_after, _, _ = at_t(changed_y, changed_cov, future=True)
    future_cols = [c for c in oracle.index if c not in before.index]
    assert future_cols and all(c.split("_")[0] in ("qps",) for c in future_cols)
    assert oracle[before.index].equals(oracle_after[before.index])  # the past is the past
    assert not oracle[future_cols].equals(oracle_after[future_cols])  # and the future is read


def test_helios_oracle_is_told_the_quota_not_the_jobs(headroom, small_helios_dir):
    ds = load_helios(small_helios_dir)
    uid = ds.series_ids[0]
    y, cov = ds.arrays("gpu_demand")[uid], ds.covariate_arrays()[uid]
    base, anchors, scale = headroom.trailing_features(y, cov, ds.covariates, ds.season_length, 0.1)
    oracle = headroom.lead_features(base, y, cov, ds.covariates, anchors["last_value"], scale, ds.season_length, 6,
                                    True)
    added = [c for c in oracle.columns if c not in base.columns and c != "season_before_target"]
    told = {name for name in ds.covariates if any(c.startswith(f"{name}_") for c in added)}
    assert added and told == {"quota_gpus"}


def test_variants_are_scored_as_dprobe_evaluate_scores_and_the_test_fit_is_a_ceiling(headroom, small_helios_dir):
    ds = load_helios(small_helios_dir)
    result = evaluate_dataset(ds, cfg=EvalConfig(progress=False, baselines=("last_value",)))
    series = result.actuals["gpu_demand"]
    starts = {u: result.test_start[f"gpu_demand/{u}"] for u in series}
    rows = {}
    for variant in headroom.VARIANTS:
        per = headroom.reference_forecasts(ds, series, starts, variant, rounds=40, threads=1, max_rows=4000)
        for uid, f in per.items():
            assert f.origins[0] == starts[uid] and f.quantiles.shape == (len(f.origins), 3, 3)
            assert np.all(np.diff(f.quantiles, axis=2) >= 0)  # p50 <= p90 <= p99
        rows[variant] = score(variant, "gpu_demand", ds, per, series, starts)
    baseline = [r for r in result.rows if r["method"] == "last_value"]
    for scored in rows.values():
        assert [r["lead_steps"] for r in scored] == [r["lead_steps"] for r in baseline]
        assert [r["n_forecasts"] for r in scored] == [r["n_forecasts"] for r in baseline]
    fit = {r["lead_steps"]: r["pinball"] for r in rows["lightgbm_fit_on_test"]}
    forecast = {r["lead_steps"]: r["pinball"] for r in rows["lightgbm"]}
    assert all(fit[h] < forecast[h] for h in ds.lead_steps)  # fitted on what it is scored on: lower loss
    for r in rows["lightgbm"]:
        assert 0.7 <= r["coverage_p90"] <= 1.0  # calibrated on the 60-70 % span
    table = headroom.ratios([*result.rows, *rows["lightgbm"]], ["lightgbm"], ["last_value"])
    assert [e["lead_steps"] for e in table] == list(ds.lead_steps)
    for e, r, b in zip(table, rows["lightgbm"], baseline, strict=True):
        assert e["lightgbm"]["pinball_ratio"] == pytest.approx(r["pinball"] / b["pinball"])
