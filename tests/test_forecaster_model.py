"""The forecaster's pieces: window features, quantile heads, loss, the time split, inference."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from dprobe.forecaster.base import ForecastInput
from dprobe.forecaster.checkpoint import ModelForecaster, export_checkpoint
from dprobe.forecaster.features import N_STATS, REGIMES, make_features, nanmedian_rows, window_stats
from dprobe.forecaster.module import ForecasterModule, pinball_loss
from dprobe.forecaster.network import PatchForecaster, QuantileHead
from dprobe.forecaster.tasks import TaskSpec
from dprobe.forecaster.windows import SeriesDataModule, WindowBatch


def test_features_are_relative_to_last_observation_and_mask_gaps():
    values = np.array([[np.nan, 10.0, 12.0, np.nan, 14.0, np.nan]])
    feats, stats, last, scale = make_features(values, None, floor=1.0)
    assert last[0] == 14.0
    assert scale[0] == pytest.approx(12.0)  # mean |value| of the observed points
    np.testing.assert_allclose(feats[0, :, 0], [0, -4 / 12, -2 / 12, 0, 0, 0], atol=1e-6)
    np.testing.assert_array_equal(feats[0, :, 1], [0, 1, 1, 0, 1, 0])
    assert stats.shape == (1, N_STATS) and np.isfinite(stats).all()


def test_scale_floor_keeps_idle_windows_from_exploding():
    values = np.zeros((1, 20))
    _, _, last, scale = make_features(values, None, floor=5.0)
    assert last[0] == 0.0 and scale[0] == 5.0


def test_all_gap_window_gives_finite_features():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning leaks out
        feats, stats, last, scale = make_features(np.full((2, 16), np.nan), np.full((2, 16, 2), np.nan), 1.0)
    assert np.isfinite(feats).all() and np.isfinite(stats).all() and (last == 0).all()


def test_nanmedian_rows_matches_numpy():
    rng = np.random.default_rng(0)
    a = rng.random((40, 9))
    a[a < 0.3] = np.nan
    a[0] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        np.testing.assert_allclose(nanmedian_rows(a), np.nanmedian(a, axis=1), equal_nan=True)


def test_window_stats_medians():
    x = np.array([[5.0, 1.0, 2.0, np.nan, 3.0, 100.0]])
    s = window_stats(x, last=np.array([100.0]), scale=np.array([1.0]))
    assert s[0, 0] == pytest.approx(np.median([1, 2, 3, 100]))  # median of the last 5 observed
    assert s[0, 5] == 1.0 and s[0, 6] == 50.0  # min, max (clipped to +-50)


def test_quantile_head_never_crosses():
    head = QuantileHead(8, 4, n_leads=3, n_quantiles=3)
    torch.nn.init.normal_(head.proj.weight, std=3.0)
    q = head(torch.randn(64, 8), torch.randn(64, 4))
    assert q.shape == (64, 3, 3)
    assert (q.diff(dim=-1) >= 0).all()


def test_pinball_loss_by_hand_with_gaps_and_weights():
    levels = torch.tensor([0.5, 0.9])
    pred = torch.tensor([[[1.0, 2.0]], [[0.0, 0.0]]])  # [B=2, H=1, Q=2]
    target = torch.tensor([[3.0], [float("nan")]])
    # row 0: diff 2 and 1 -> 0.5*2=1.0, 0.9*1=0.9; mean over one observed target and 2 levels
    assert pinball_loss(pred, target, levels).item() == pytest.approx((1.0 + 0.9) / 2)
    w = torch.tensor([0.5, 1.0])
    assert pinball_loss(pred, target, levels, w).item() == pytest.approx(0.5 * 1.9 / (2 * 0.5))


def test_network_shapes_and_task_routing():
    net = PatchForecaster(n_features=6, n_stats=N_STATS, context_length=64, n_tasks=3, n_leads=3, d_model=16,
                          n_heads=2, n_layers=1)
    for head in net.heads:
        torch.nn.init.normal_(head.proj.bias)
    x, s = torch.randn(5, 64, 6), torch.randn(5, N_STATS)
    task = torch.tensor([0, 1, 2, 1, 0])
    out = net(x, s, task)
    assert out.shape == (5, 3, 3)
    alone = net(x[1:2], s[1:2], task[1:2])  # a row's result does not depend on the batch
    net.eval()
    torch.testing.assert_close(net(x, s, task)[1], net(x[1:2], s[1:2], task[1:2])[0])
    assert alone.shape == (1, 3, 3)


def _forecaster(tmp_path, context=32) -> ModelForecaster:
    module = ForecasterModule(n_tasks=1, context_length=context, d_model=16, n_heads=2, n_layers=1)
    spec = TaskSpec("gpu_demand", "helios-earth-vc", (6, 12, 24), 300.0, (), 10.0)
    obj = torch.load(export_checkpoint(module, [spec], tmp_path / "m.pt"), weights_only=True)
    return ModelForecaster(obj)


def test_untrained_model_forecasts_the_last_value(tmp_path):
    """Heads start at zero in window units: an untrained model is exactly the last-value forecast."""
    model = _forecaster(tmp_path)
    values = np.array([[3.0, 4.0, np.nan, 7.0, np.nan], [1.0] * 5])  # shorter than the context: padded
    f = model.predict(ForecastInput(values=values, metric="gpu_demand", leads=(24, 6), step_seconds=300))
    np.testing.assert_allclose(f.point, [[7.0, 7.0], [1.0, 1.0]])
    assert f.quantiles.shape == (2, 2, 3)


def test_time_split_never_leaks_the_test_span(small_helios_dir):
    dm = SeriesDataModule([str(small_helios_dir)], context_length=32, val_start=0.6, test_start=0.7)
    dm.setup()
    lengths = dm.tasks[0].lengths
    h = max(dm.tasks[0].spec.leads)
    tr, va = dm._train_rows, dm._val_rows
    assert (tr[:, 2] + h < (lengths[tr[:, 1]] * 0.6).astype(int)).all()
    assert (va[:, 2] >= (lengths[va[:, 1]] * 0.6).astype(int)).all()
    assert (va[:, 2] + h < (lengths[va[:, 1]] * 0.7).astype(int)).all()
    batch = next(iter(dm.train_dataloader()))
    assert batch.features.shape[1:] == (32, 6) and batch.target.shape[1] == 3
    assert len(dm.task_weights) == 1 and dm.task_weights[0] == pytest.approx(1.0)


# p99 of _trained_like in window units: 1 + 2 softplus(0)
P99 = 1 + 2 * np.log(2.0)


def _trained_like(tmp_path) -> ModelForecaster:
    """A model whose heads give a fixed, non-trivial answer (bias only), to check the plumbing: in
    window units p50 = 1 (served as the last value in a flat window), p90 = 1 + log 2, p99 = P99."""
    module = ForecasterModule(n_tasks=2, context_length=32, d_model=16, n_heads=2, n_layers=1)
    for head in module.net.heads:
        head.proj.bias.data = torch.tensor([1.0, 0.0, 0.0] * 3)
    specs = [TaskSpec("gpu_demand", "helios-earth-vc", (6, 12, 24), 300.0, (), 1.0),
             TaskSpec("gpu_duty_cycle_pct", "alibaba-genai-2026", (5, 15, 30), 60.0, (), 1.0)]
    return ModelForecaster(torch.load(export_checkpoint(module, specs, tmp_path / "m.pt"), weights_only=True))


def test_leads_between_trained_ones_are_interpolated(tmp_path):
    model = _trained_like(tmp_path)
    values = np.full((1, 40), 10.0)  # scale 10, last 10: the p99 at trained leads is 10 + 10 * P99
    f = model.predict(ForecastInput(values=values, metric="gpu_demand", leads=(3, 6, 18), step_seconds=300))
    np.testing.assert_allclose(f.quantiles[..., 2], [[10 + 5 * P99, 10 + 10 * P99, 10 + 10 * P99]])
    np.testing.assert_allclose(f.point, [[10.0, 10.0, 10.0]])  # a flat window: the point is its last value
    with pytest.raises(ValueError, match="up to 24 steps"):
        model.predict(ForecastInput(values=values, metric="gpu_demand", leads=(25,), step_seconds=300))
    model.short_lead_exponents = [0.5, 1.0]  # below the first lead the spread grows as a random walk's
    f = model.predict(ForecastInput(values=values, metric="gpu_demand", leads=(3, 6, 18), step_seconds=300))
    np.testing.assert_allclose(f.quantiles[..., 2], [[10 + 0.5**0.5 * 10 * P99, 10 + 10 * P99, 10 + 10 * P99]])
    np.testing.assert_allclose(f.point, [[10.0, 10.0, 10.0]])


def test_the_quantile_spread_below_the_first_lead_is_chosen_on_validation():
    """A random walk's spread grows as the square root of the lead; that of a series whose slope is
    unknown grows linearly. Given a forecaster exact at the first trained lead, the choice follows."""
    from types import SimpleNamespace

    from dprobe.forecaster.calibration import select_short_lead_exponents
    from dprobe.forecaster.features import last_observed
    from dprobe.forecaster.windows import TaskSeries

    rng = np.random.default_rng(0)
    n_series, length, first, z = 40, 400, 8, np.array([0.0, 1.2816, 2.3263])  # p50 / p90 / p99 of N(0, 1)
    walk = 100 + rng.normal(size=(n_series, length)).cumsum(axis=1)
    slope = 100 + rng.normal(size=(n_series, 1)) * np.arange(length)[None]

    class Exact:  # the right quantiles at the first lead: last + z * sd(lead)
        quantile_levels, context_length, conditioned = (0.5, 0.9, 0.99), 32, False

        def __init__(self, sd_at_first: float) -> None:
            self.sd = sd_at_first

        def predict_task(self, k, spec, values, cov, cond=None, known=None):
            return (last_observed(values)[:, None, None] + self.sd * z[None, None, :]).repeat(len(spec.leads), 1)

    for values, sd, expected in ((walk, first**0.5, 0.5), (slope, float(first), 1.0)):
        spec = TaskSpec("gpu_demand", "x", (first, 2 * first), 300.0, (), 1.0)
        ts = TaskSeries(spec, values, None, np.full(n_series, length), np.zeros((n_series, 1)),
                        np.zeros(n_series, bool))
        origins = np.arange(100, length - 2 * first, 7)
        rows = np.array([(0, s, o) for s in range(n_series) for o in origins])
        dm = SimpleNamespace(tasks=[ts], calibration_rows=rows)
        assert select_short_lead_exponents(Exact(sd), dm) == [expected]


def test_finer_windows_are_averaged_to_the_trained_step(tmp_path):
    model = _trained_like(tmp_path)
    # sampled every 60 s; the model's step is 300 s: blocks of 5 are averaged, lead 30 steps = 6 model steps
    values = np.tile([8.0, 12.0, 10.0, 10.0, 10.0], 40)[None, :]
    f = model.predict(ForecastInput(values=values, metric="gpu_demand", leads=(30,), step_seconds=60))
    np.testing.assert_allclose(f.quantiles[..., 2], [[10 + 10 * P99]])
    with pytest.raises(ValueError, match="coarser"):
        model.predict(ForecastInput(values=values, metric="gpu_demand", leads=(1,), step_seconds=3600))


def test_utilization_ratio_is_served_by_the_duty_cycle_task(tmp_path):
    model = _trained_like(tmp_path)
    ratio = np.full((1, 40), 0.2)  # 20 %
    f = model.predict(ForecastInput(values=ratio, metric="gpu_utilization_ratio", leads=(5,), step_seconds=60))
    np.testing.assert_allclose(f.quantiles[..., 2], [[0.2 + 0.2 * P99]])  # 20 % + P99 scales of 20 %
    assert model.max_horizon_seconds("gpu_utilization_ratio") == 30 * 60


def test_point_source_is_chosen_on_validation_and_applied(tmp_path, small_helios_dir):
    """An untrained model's p50 is the last value; where the window median does better on the
    validation windows it is chosen instead, and the checkpoint's forecasts follow the choice."""
    from dprobe.forecaster.calibration import select_point_sources
    from dprobe.forecaster.features import POINT_CANDIDATES

    dm = SeriesDataModule([str(small_helios_dir)], context_length=32, val_samples=500)
    dm.setup()
    module = ForecasterModule(n_tasks=1, context_length=32, d_model=16, n_heads=2, n_layers=1)
    sources = select_point_sources(module, dm)
    assert len(sources) == 1 and len(sources[0]) == 3  # per lead, one choice per regime (moved, held)
    assert all(len(c) == len(REGIMES) and set(c) <= set(POINT_CANDIDATES) for c in sources[0])
    obj = torch.load(export_checkpoint(module, dm.task_specs, tmp_path / "m.pt",
                                       point_sources=[["median_5", "model", "last_value"]]), weights_only=True)
    model = ModelForecaster(obj)
    values = np.array([[10.0] * 28 + [30.0, 12.0, 14.0, 11.0]])
    f = model.predict(ForecastInput(values=values, metric="gpu_demand", leads=(6, 12, 24), step_seconds=300))
    np.testing.assert_allclose(f.point, [[12.0, 11.0, 11.0]])  # median of the last 5; last value twice
    # per regime: the median where the last step moved, the last value where an earlier one did or none
    obj = torch.load(export_checkpoint(module, dm.task_specs, tmp_path / "r.pt",
                                       point_sources=[[["median_5", "last_value", "last_value"]] * 3]),
                     weights_only=True)
    recent = np.array([[10.0] * 27 + [30.0, 12.0, 14.0, 11.0, 11.0]])
    f = ModelForecaster(obj).predict(ForecastInput(values=np.concatenate([values, recent]), metric="gpu_demand",
                                                   leads=(6, 12, 24), step_seconds=300))
    np.testing.assert_allclose(f.point, [[12.0] * 3, [11.0] * 3])
    # a checkpoint chosen per regimes of another kind is refused, not misread
    from dprobe.forecaster.loading import CheckpointError, load_forecaster

    torch.save({**obj, "regimes": ["moved", "held"]}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match=r"other.pt.*per regime of \['moved', 'held'\].*train it again"):
        load_forecaster(str(tmp_path / "other.pt"))


def test_window_regime_says_whether_the_last_step_moved() -> None:
    from dprobe.forecaster.features import window_regime

    nan = np.nan
    flat = [5.0] * 10
    windows = np.array([flat + [1.0, 2.0, 3.0],  # moved
                        flat + [1.0, 3.0, 3.0],  # moved one step earlier: recent
                        [1.0, 2.0] + [2.0] * 11,  # last moved 11 steps ago: held
                        flat + [1.0, 2.0, nan],  # a gap at the end: the last value is held until seen again
                        flat + [2.0, nan, 3.0],  # moved across a gap
                        [nan] * 12 + [3.0],  # first value: nothing to compare with
                        [nan] * 13])
    assert [REGIMES[r] for r in window_regime(windows)] == ["moved", "recent", "held", "recent", "moved", "held",
                                                           "held"]
    assert window_regime(np.ones((2, 1))).tolist() == [2, 2]


def test_onnx_export_forecasts_like_the_torch_model_without_torch(tmp_path):
    """dprobe.onnx (what the sidecar runs) gives the checkpoint's forecasts, loaded in a process without torch."""
    import json
    import subprocess
    import sys

    from dprobe.forecaster.loading import CheckpointError, open_forecaster, read_checkpoint
    from dprobe.forecaster.onnx_export import export_onnx

    module = ForecasterModule(n_tasks=2, context_length=32, d_model=16, n_heads=2, n_layers=1)
    torch.manual_seed(0)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.2)  # a non-trivial network
    specs = [TaskSpec("gpu_demand", "helios-earth-vc", (6, 12, 24), 300.0, (), 1.0),
             TaskSpec("gpu_duty_cycle_pct", "alibaba-genai-2026", (5, 15, 30), 60.0, (), 1.0)]
    shifts = np.random.default_rng(1).uniform(0, 0.5, (len(REGIMES), 3, 3))  # per regime, lead, quantile
    shifts[..., 0] = 0
    pt = export_checkpoint(module, specs, tmp_path / "m.pt",
                           point_sources=[["model", ["median_5", "last_value", "median_5"], "model"], ["model"] * 3],
                           quantile_shifts=[shifts.tolist(), np.zeros((3, 3)).tolist()],
                           short_lead_exponents=[0.5, 1.0])  # lead 3 below: the square root
    assert read_checkpoint(pt)["short_lead_exponents"] == [0.5, 1.0]
    onnx_path = export_onnx(read_checkpoint(pt), tmp_path / "m.onnx")
    values = np.random.default_rng(0).uniform(0, 50, (6, 80))
    values[0, -10:] = np.nan
    batch = ForecastInput(values=values, metric="gpu_demand", leads=(3, 12, 24), step_seconds=300)
    ref = open_forecaster(str(pt)).forecaster.predict(batch).quantiles
    loaded = open_forecaster(str(onnx_path))
    assert loaded.kind.endswith("(onnx)") and loaded.forecaster.short_lead_exponents == [0.5, 1.0]
    np.testing.assert_allclose(loaded.forecaster.predict(batch).quantiles, ref, rtol=1e-4, atol=1e-4)

    code = ("import sys, json, numpy as np\n"
            "from dprobe.forecaster.loading import load_forecaster\n"
            "from dprobe.forecaster.base import ForecastInput\n"
            f"m = load_forecaster({str(onnx_path)!r})\n"
            "v = np.array(json.loads(sys.stdin.read()))\n"
            "q = m.predict(ForecastInput(values=v, metric='gpu_demand', leads=(3, 12, 24), step_seconds=300))\n"
            "print(json.dumps({'torch': 'torch' in sys.modules, 'q': q.quantiles.tolist()}))\n")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(np.nan_to_num(values, nan=-1).tolist()),
                         capture_output=True, text=True, check=True, timeout=120)
    result = json.loads(out.stdout)
    assert result["torch"] is False
    clean = np.nan_to_num(values, nan=-1)
    expect = open_forecaster(str(pt)).forecaster.predict(
        ForecastInput(values=clean, metric="gpu_demand", leads=(3, 12, 24), step_seconds=300)).quantiles
    np.testing.assert_allclose(result["q"], expect, rtol=1e-4, atol=1e-4)

    broken = tmp_path / "broken.onnx"
    broken.write_bytes(onnx_path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="broken.onnx"):
        open_forecaster(str(broken))


def test_the_checkpoint_records_the_split_it_was_fitted_with(small_helios_dir, tmp_path):
    """build_checkpoint calibrates on the data module's validation windows and records its split, which the
    torch and ONNX forecasters read back; a checkpoint from before splits were recorded has the default one."""
    from dprobe.core.split import Split
    from dprobe.forecaster.calibration import build_checkpoint
    from dprobe.forecaster.checkpoint import save_checkpoint
    from dprobe.forecaster.loading import load_forecaster, read_checkpoint
    from dprobe.forecaster.onnx_export import export_onnx

    dm = SeriesDataModule([str(small_helios_dir)], context_length=32, val_samples=100, val_start=0.5,
                          test_start=0.8)
    dm.setup()
    assert dm.split == Split(validation_start=0.5, test_start=0.8)
    module = ForecasterModule(n_tasks=1, context_length=32, d_model=16, n_heads=2, n_layers=1)
    obj = build_checkpoint(module, dm)
    assert list(obj) == ["kind", "format", "dprobe_version", "hparams", "tasks", "point_sources", "quantile_shifts",
                         "regimes", "workloads_trained", "workload_tasks", "short_lead_exponents", "split",
                         "state_dict"]
    assert obj["split"] == {"validation_start": 0.5, "test_start": 0.8}
    assert len(obj["quantile_shifts"]) == len(obj["short_lead_exponents"]) == 1
    pt = save_checkpoint(obj, tmp_path / "dprobe.pt")
    assert read_checkpoint(pt)["split"] == obj["split"]  # plain floats: a weights-only load reads them
    onnx_path = export_onnx(obj, tmp_path / "dprobe.onnx")
    for path in (pt, onnx_path):
        assert load_forecaster(str(path)).split == dm.split
    plain = build_checkpoint(module, dm, select_point=False, calibrate_quantiles=False)
    assert plain["quantile_shifts"] == [] and plain["point_sources"] == [["model"] * 3]
    old = {k: v for k, v in obj.items() if k != "split"}
    torch.save(old, tmp_path / "old.pt")
    assert load_forecaster(str(tmp_path / "old.pt")).split == Split()


def test_conformal_shifts_make_validation_coverage_nominal(small_helios_dir, tmp_path):
    """After the shifts, p90 / p99 cover 90 % / 99 % of the validation windows (all of them) they were fitted on."""
    from dprobe.forecaster.calibration import conformal_shifts

    dm = SeriesDataModule([str(small_helios_dir)], context_length=32, val_samples=100)
    dm.setup()
    # calibration sees every validation window, early stopping a sample of them
    every = {tuple(r) for r in dm._calibration_rows}
    assert len(every) > len(dm._val_rows) == 100 and {tuple(r) for r in dm._val_rows} <= every
    module = ForecasterModule(n_tasks=1, context_length=32, d_model=16, n_heads=2, n_layers=1).eval()
    shifts = np.asarray(conformal_shifts(module, dm, by_regime=True)[0])  # (R, H, Q): per regime of the window
    assert shifts.shape == (len(REGIMES), 3, 3) and (shifts[..., 0] == 0).all()
    ys, qs, rs = [], [], []
    with torch.no_grad():
        for batch in dm.calibration_dataloader():
            qs.append(module(batch.features, batch.stats, batch.task).numpy() + shifts[batch.regime.numpy()])
            ys.append(batch.target.numpy())
            rs.append(batch.regime.numpy())
    y, q, r = np.concatenate(ys), np.concatenate(qs), np.concatenate(rs)
    assert len(set(r.tolist())) > 1  # several regimes occur (few windows moved here: they take the shift of all)
    # overall, and within each regime with enough windows for a shift of its own (Mondrian)
    for rows, slack in [(np.ones(len(y), bool), 0.02)] + [(r == k, 0.05) for k in range(len(REGIMES))
                                                          if (r == k).sum() >= 50]:  # fewer windows, more ties
        ok = ~np.isnan(y) & rows[:, None]
        for i, level in ((1, 0.9), (2, 0.99)):
            cover = (y[ok] <= q[..., i][ok]).mean()
            assert level - 0.01 <= cover <= level + slack
    # the shifts travel in the checkpoint and move the forecaster's quantiles
    spec = dm.task_specs
    plain = ModelForecaster(torch.load(export_checkpoint(module, spec, tmp_path / "a.pt"), weights_only=True))
    shifted = ModelForecaster(torch.load(export_checkpoint(module, spec, tmp_path / "b.pt",
                                                           quantile_shifts=[shifts.tolist()]), weights_only=True))
    values = np.linspace(5, 9, 40)[None]
    batch = ForecastInput(values=values, metric="gpu_demand", leads=(6, 12, 24), step_seconds=300)
    a, b = plain.predict(batch).quantiles, shifted.predict(batch).quantiles
    np.testing.assert_allclose(a[..., 0], b[..., 0])  # the p50 is not shifted
    assert not np.allclose(a[..., 2], b[..., 2])


def test_point_choice_needs_a_gain_across_series_not_in_one():
    """A candidate whose lower validation MAE comes from one series stays unchosen; one that is
    better on every series is chosen; the last value is the default."""
    from dprobe.forecaster.calibration import _robust_choice

    rng = np.random.default_rng(0)
    names = ["model", "last_value", "median_5"]
    n_series, per = 20, 30
    series = np.repeat(np.arange(n_series), per)
    err = np.abs(rng.normal(1.0, 0.3, size=(len(series), 3, 2)))
    # lead 0: the model is far better on series 0 only (lower MAE overall), a little worse on all others;
    # median_5 no better anywhere
    err[:, 0, 0] = err[:, 1, 0] * 1.05
    err[series == 0, 0, 0] = 0.0
    err[series == 0, 1, 0] += 15.0
    err[:, 2, 0] = err[:, 1, 0] + 0.01
    # lead 1: median_5 is a little better on every series
    err[:, 2, 1] = err[:, 1, 1] * 0.8
    mae = err.mean(0)
    assert mae[0, 0] < mae[1, 0]  # the plain argmin would pick the model at lead 0
    choice = _robust_choice(err, series, names, confidence=0.9, n_boot=300, rng=np.random.default_rng(1))
    assert choice == ["last_value", "median_5"]


def test_point_candidates_match_the_moving_median_baseline_across_gaps():
    from dprobe.forecaster.baselines import moving_median_path
    from dprobe.forecaster.features import SIMPLE_POINTS, candidate_points, last_observed, window_scale

    values = np.array([[5.0, np.nan, 7.0, 1.0, np.nan, np.nan, 9.0, np.nan]])
    last, scale = last_observed(values), window_scale(values, 1.0)
    cands = candidate_points(values, last, scale)
    median_30 = last + scale * cands[:, SIMPLE_POINTS.index("median_30")]
    np.testing.assert_allclose(median_30, moving_median_path(values, [1], 30)[:, -1, 0])


def test_served_model_point_stays_within_the_simple_forecasts():
    """A flat window's point is its last value whatever the network says; elsewhere the network's
    p50 is kept between the lowest and highest simple forecast (the last value counts, at 0)."""
    from dprobe.forecaster.features import SIMPLE_POINTS, served_point

    n_cands = len(SIMPLE_POINTS)
    cands = np.zeros((3, n_cands))
    cands[1] = np.linspace(0.2, 1.0, n_cands)  # a window whose recent medians and means sit above its last value
    cands[2] = -np.linspace(0.2, 1.0, n_cands)
    p50 = np.array([[0.3, -0.2], [1.5, 0.5], [0.4, -2.0]])
    point = served_point(p50, cands, ["model", "model"])
    np.testing.assert_allclose(point, [[0.0, 0.0], [1.0, 0.5], [0.0, -1.0]])
    median_5 = served_point(p50, cands, ["median_5", "model"])[:, 0]
    np.testing.assert_allclose(median_5, cands[:, SIMPLE_POINTS.index("median_5")])
    # model_recent: within the last value, the 5-step median and the EWMA only (not the 30-step median or mean)
    cands[1] = [0.0, 0.2, 1.0, 0.9, 0.4]  # last, median_5, median_30, mean_30, ewma
    recent = served_point(p50, cands, ["model_recent", "model"])
    np.testing.assert_allclose(recent[:, 0], [0.0, 0.4, 0.0])
    np.testing.assert_allclose(recent[:, 1], point[:, 1])


def test_point_choice_prefers_the_cautious_model_point_unless_the_other_beats_it():
    """The last value is the default; the lowest-MAE candidate that beats it in 90 % of series
    resamples replaces it, and ``model`` must also beat ``model_recent`` to be chosen over it."""
    from dprobe.forecaster.calibration import _robust_choice
    from dprobe.forecaster.features import POINT_CANDIDATES

    names = list(POINT_CANDIDATES)
    rng = np.random.default_rng(0)
    n_series, per = 40, 25
    series = np.repeat(np.arange(n_series), per)
    err = np.full((len(series), len(names), 3), 2.0) + rng.uniform(0, 0.2, (len(series), len(names), 3))
    m, r = names.index("model"), names.index("model_recent")
    err[:, m, 0], err[:, r, 0] = 1.0, 1.5  # lead 0: model clearly best
    # lead 1: model a hair lower on average than model_recent, but better on only half the series
    err[:, r, 1] = 1.0
    err[:, m, 1] = 1.0 + np.where(series % 2 == 0, 0.3, -0.32)
    # lead 2: median_5 lower on average than the last value, but only thanks to 3 series
    err[:, :, 2] = 2.5
    err[:, names.index("median_5"), 2] = np.where(series < 3, 0.0, 2.25)
    err[:, names.index("last_value"), 2] = 2.1
    assert err[:, m, 1].mean() < err[:, r, 1].mean() and err[:, names.index("median_5"), 2].mean() < 2.1
    choice = _robust_choice(err, series, names, 0.9, 500, np.random.default_rng(1))
    assert choice == ["model", "model_recent", "last_value"]
    keep = [i for i, n in enumerate(names) if n != "model_recent"]  # the candidates before model_recent
    assert _robust_choice(err[:, keep], series, [names[i] for i in keep], 0.9, 500,
                          np.random.default_rng(1))[:2] == ["model", "model"]


def test_busy_windows_weigh_less_in_training_only(small_alibaba_dir):
    from dprobe.forecaster.features import change_factor, window_change

    x = np.array([[0.0, 1.0, 1.0, 3.0], [2.0, 2.0, 0.0, 0.0]])
    np.testing.assert_allclose(window_change(x, np.array([[1, 1, 1, 1], [1, 1, 0, 1]])), [1.0, 0.0])
    np.testing.assert_allclose(change_factor(np.array([0.0, 0.05, 0.5, 1.0, 2.0]), 1.0, 4.0), [4, 4, 2, 1, 0.5])

    kwargs = dict(context_length=32, batch_size=256, samples_per_epoch=256, val_samples=128)
    plain = SeriesDataModule([str(small_alibaba_dir)], **kwargs)
    plain.setup()
    assert plain.change_weighting is None  # off by default: every window weighs its task's weight
    plain_batch = next(iter(plain.train_dataloader()))
    torch.testing.assert_close(plain_batch.weight, torch.tensor(plain.task_weights)[plain_batch.task])

    dm = SeriesDataModule([str(small_alibaba_dir)], calm_weight=5.0, **kwargs)
    dm.setup()
    assert dm.task_weights == plain.task_weights
    typical, mean = dm.change_weighting.typical, dm.change_weighting.mean
    assert dm.change_weighting.calm_weight == 5.0 and all(m > 0 for m in mean)
    batch = next(iter(dm.train_dataloader()))
    change = window_change(batch.features[..., 0].numpy(), batch.features[..., 1].numpy())
    task = batch.task.numpy()
    task_w = np.array(dm.task_weights)[task]
    expected = np.empty(len(task))
    for k in set(task):
        rows = task == k
        expected[rows] = task_w[rows] * change_factor(change[rows], typical[k], 5.0) / mean[k]
    np.testing.assert_allclose(batch.weight.numpy(), expected, rtol=1e-4)
    busy = change > 2 * np.array(typical)[task]
    quiet = change < np.array(typical)[task] / 5.0
    assert busy.any() and quiet.any()
    relative = batch.weight.numpy() / task_w
    assert relative[busy].max() < relative[quiet].min()  # busy windows count less than calm ones
    assert 0.7 < relative.mean() < 1.3  # renormalised: the task keeps about its share of the loss
    val = next(iter(dm.val_dataloader()))
    torch.testing.assert_close(val.weight, torch.tensor(dm.task_weights)[val.task])  # training only
    with pytest.raises(ValueError, match="calm_weight must be at least 1"):
        SeriesDataModule([str(small_alibaba_dir)], calm_weight=0.5)


def test_covariate_dropout_blanks_whole_windows_in_training_only(small_alibaba_dir):
    dm = SeriesDataModule([str(small_alibaba_dir)], context_length=32, batch_size=128, samples_per_epoch=256,
                          val_samples=128, covariate_dropout=0.5)
    dm.setup()
    train = next(iter(dm.train_dataloader()))
    covs = train.features[..., 2:]  # covariate channels
    blank = (covs == 0).flatten(1).all(1)
    assert 0.25 < blank.float().mean() < 0.75  # about half the windows lose all their covariates
    val = next(iter(dm.val_dataloader()))
    has = (val.features[..., 2:] != 0).flatten(1).any(1).float().mean()
    assert has > 0.9  # validation windows keep theirs


def _validation_batch(y: np.ndarray, points: torch.Tensor, regime: torch.Tensor) -> WindowBatch:
    """Validation windows of one task whose targets are ``y`` (N, H) in window units, over 20 series (the
    features are left empty: the stand-in networks below ignore them)."""
    n = len(y)
    return WindowBatch(features=torch.zeros(n, 1), stats=torch.zeros(n, 1), weight=torch.ones(n),
                       target=torch.from_numpy(y).float(), task=torch.zeros(n, dtype=torch.long),
                       workload=torch.zeros(n, 1), known=torch.zeros(n, dtype=torch.bool), points=points,
                       scale=torch.ones(n), series=torch.arange(n) % 20, regime=regime)


def test_conformal_shifts_calibrate_what_is_served_after_the_point_choice():
    """Upper quantiles are raised to the chosen point when served, so windows below the point are
    covered whatever the shift: the shift is calibrated on the others, not on all of them."""
    from types import SimpleNamespace

    from dprobe.forecaster.calibration import conformal_shifts
    from dprobe.forecaster.features import SIMPLE_POINTS

    rng = np.random.default_rng(0)
    n = 4000
    y = rng.uniform(0, 2, size=(n, 1))
    cands = np.zeros((n, len(SIMPLE_POINTS)), dtype=np.float32)
    cands[: n // 2, SIMPLE_POINTS.index("median_30")] = 3.0  # half the points above every y
    batch = _validation_batch(y, torch.from_numpy(cands), torch.zeros(n, dtype=torch.long))

    class Fixed(torch.nn.Module):  # quantiles 0, 0, 0 for every window
        hparams = SimpleNamespace(quantiles=(0.5, 0.9, 0.99), n_leads=1)

        def forward(self, x, *rest):
            return torch.zeros(len(x), 1, 3)

    dm = SimpleNamespace(tasks=[None], calibration_dataloader=lambda: [batch])
    plain = np.asarray(conformal_shifts(Fixed(), dm)[0])[0]  # every window "moved": regime 0
    served = np.asarray(conformal_shifts(Fixed(), dm, [["median_30"]])[0])[0]
    assert abs(plain[0, 1] - 1.8) < 0.05  # 90 % of y below it
    assert abs(served[0, 1] - 1.6) < 0.05  # half covered by the point: 80 % of the rest suffice
    point = cands[:, SIMPLE_POINTS.index("median_30")]
    for shift, expected in ((plain[0, 1], 0.95), (served[0, 1], 0.90)):
        cover = (y[:, 0] <= np.maximum(shift, point)).mean()
        assert abs(cover - expected) < 0.01


def test_quantiles_are_calibrated_per_regime_and_the_point_choice_starts_from_the_overall_one():
    """Mondrian calibration: windows whose last step moved spread wider than held ones, and each regime
    gets the shift that covers its own windows; a regime with too few windows takes the shift of all.
    The point choice of a regime must beat the choice made on all windows, not only the last value."""
    from types import SimpleNamespace

    from dprobe.forecaster.calibration import _robust_choice, conformal_shifts
    from dprobe.forecaster.features import SIMPLE_POINTS

    rng = np.random.default_rng(0)
    n = 6000
    regime = (np.arange(n) % 3 > 0).astype(np.int64)  # a third moved, the rest held
    y = np.where(regime == 0, rng.uniform(0, 4, n), rng.uniform(0, 1, n))[:, None]
    batch = _validation_batch(y, torch.zeros(n, len(SIMPLE_POINTS)), torch.from_numpy(regime))

    class Fixed(torch.nn.Module):
        hparams = SimpleNamespace(quantiles=(0.5, 0.9, 0.99), n_leads=1)

        def forward(self, x, *rest):
            return torch.zeros(len(x), 1, 3)

    dm = SimpleNamespace(tasks=[None], calibration_dataloader=lambda: [batch])
    shifts = np.asarray(conformal_shifts(Fixed(), dm)[0])  # (R, H, Q); cross-fitting keeps the regimes apart
    assert abs(shifts[0, 0, 1] - 3.6) < 0.15 and abs(shifts[1, 0, 1] - 0.9) < 0.05
    for r in (0, 1):
        assert abs((y[regime == r, 0] <= shifts[r, 0, 1]).mean() - 0.9) < 0.01
    pooled = np.asarray(conformal_shifts(Fixed(), dm, by_regime=False)[0])
    np.testing.assert_allclose(pooled[0], pooled[1])
    assert shifts[1, 0, 1] < pooled[0, 0, 1] < shifts[0, 0, 1]
    few = np.asarray(conformal_shifts(Fixed(), dm, min_windows=3000, by_regime=True)[0])  # 2,000 moved: too few
    assert shifts[1, 0, 1] < few[0, 0, 1] < shifts[0, 0, 1]  # the moved regime takes the shift of all windows
    np.testing.assert_allclose(few[1], shifts[1])  # held: its own 4,000 windows

    # candidates 0 / 1 equally good; 2 worse. From the default "b" nothing moves it; from "c", "a" or "b" win
    names = ["a", "b", "c", "last_value"]
    err = np.stack([rng.uniform(0, 1, 2000), rng.uniform(0, 1, 2000), rng.uniform(1, 2, 2000),
                    rng.uniform(0.9, 1.9, 2000)], axis=1)[:, :, None]
    series = np.arange(2000) % 40
    assert _robust_choice(err, series, names, 0.9, 300, rng, ["b"]) == ["b"]
    assert _robust_choice(err, series, names, 0.9, 300, rng, ["c"])[0] in ("a", "b")
