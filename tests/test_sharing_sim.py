"""`dprobe simulate sharing`: pods packed onto shared GPUs, scored against what they did (dprobe.sim.sharing)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dprobe.cli import main
from dprobe.data.alibaba import load_alibaba
from dprobe.sharing.planner import PlanSettings
from dprobe.sim.sharing.packing import OnePerGpu, Oracle, PeakOfHistory, _match, pod_series, simulate_sharing

GB = 1e9


@pytest.fixture(scope="module")
def series(small_alibaba_dir: Path):
    return pod_series(load_alibaba(small_alibaba_dir))


def test_only_the_test_span_is_scored(series):
    assert series.eval_start == int(0.7 * series.steps) and series.eval_end == series.steps
    assert np.all(series.scored_from >= series.eval_start)
    r = simulate_sharing(series, OnePerGpu(), 80 * GB, 30)
    assert len(r.gpus) == series.steps - series.eval_start


def test_validation_span_ends_where_the_test_span_starts(small_alibaba_dir):
    v = pod_series(load_alibaba(small_alibaba_dir), span="validation")
    assert v.eval_end == int(0.7 * v.steps) and v.eval_start == int(0.6 * v.steps)
    assert np.all(v.scored_to <= v.eval_end)
    with pytest.raises(ValueError, match="span"):
        pod_series(load_alibaba(small_alibaba_dir), span="train")


def test_one_pod_per_gpu_is_the_reference(series):
    r = simulate_sharing(series, OnePerGpu(), 80 * GB, 30)
    assert np.array_equal(r.gpus, r.pods) and r.moves == 0
    rep = r.report(r.report()["gpu_hours"])
    assert rep["gpu_hours_saved_pct"] == pytest.approx(0.0) and rep["pod_minutes_over_memory_pct"] == 0.0


def test_a_gpu_too_small_for_any_pod_overflows_every_pod_minute(series):
    r = simulate_sharing(series, OnePerGpu(), 1.0, 30)
    mem = series.filled(series.memory)[:, series.eval_start:]
    present = np.array([(np.arange(series.eval_start, series.steps) >= a) & (np.arange(series.eval_start,
                        series.steps) < b) for a, b in zip(series.scored_from, series.scored_to, strict=True)])
    assert np.array_equal(r.pods_over_memory, (present & (mem > 1.0)).sum(0))
    assert r.pods_over_memory.sum() > 0


def test_oracle_packs_without_overflow_and_peak_headroom_costs_gpus(series):
    filled = (series.filled(series.memory), series.filled(series.duty))
    ref = simulate_sharing(series, OnePerGpu(), 141 * GB, 30, filled=filled).report()["gpu_hours"]
    oracle = simulate_sharing(series, Oracle(*filled), 141 * GB, 30, filled=filled).report(ref)
    assert oracle["gpu_hours"] < ref and oracle["pod_minutes_over_memory_pct"] == 0.0
    peak = simulate_sharing(series, PeakOfHistory(126), 141 * GB, 30, filled=filled).report(ref)
    padded = simulate_sharing(series, PeakOfHistory(126, 0.5), 141 * GB, 30, filled=filled).report(ref)
    assert padded["gpu_hours"] >= peak["gpu_hours"]


def test_repacking_keeps_gpu_ids_of_pods_that_stay_together():
    old = np.array([5, 5, 7, 7, -1])
    new, nxt = _match(old, np.array([0, 0, 1, 1, 1]), 10)
    assert new[:4].tolist() == [5, 5, 7, 7] and new[4] == 7 and nxt == 10
    new, nxt = _match(old, np.array([0, 1, 0, 1, 2]), 10)
    assert len(set(new.tolist())) == 3 and nxt == 11


def test_bad_settings_are_refused(series):
    with pytest.raises(ValueError, match="interval"):
        simulate_sharing(series, OnePerGpu(), 80 * GB, 0)
    with pytest.raises(ValueError, match="GPU memory"):
        simulate_sharing(series, OnePerGpu(), float("nan"), 30)
    with pytest.raises(ValueError, match="packing policy"):
        simulate_sharing(series, OnePerGpu(), 80 * GB, 30, PlanSettings(policy="worst-fit"))


def test_cli_table_without_forecaster(capsys, small_alibaba_dir):
    code = main(["simulate", "sharing", "--quiet", "--data", str(small_alibaba_dir), "--gpu-memory", "48GB",
                 "--sharing-policies", "one-per-gpu,peak,oracle", "--packing", "first-fit"])
    out = capsys.readouterr().out
    assert code == 0
    assert "GPUs of 48 GB" in out and "| oracle |" in out and "| peak-2h |" in out and "scaled" in out


@pytest.mark.slow
def test_cli_json_and_plot(capsys, small_alibaba_dir, tmp_path):
    plot = tmp_path / "sharing.png"
    code = main(["simulate", "sharing", "--quiet", "--data", str(small_alibaba_dir), "--json", "--gpu-memory", "141GB",
                 "--plot", str(plot)])
    out = capsys.readouterr()
    assert code == 0, out.err
    report = json.loads(out.out)
    assert [p["policy"] for p in report["policies"]] == ["one-per-gpu", "peak-2h", "peak-2h+10%", "last-value",
                                                         "dprobe", "oracle"]
    assert report["settings"]["gpu_memory_bytes"] == 141 * 10**9 and "scaled" in report["note"]
    assert report["forecaster"].startswith("dprobe-forecaster")
    for p in report["policies"]:
        assert {"gpu_hours", "pod_minutes_over_memory_pct", "gpu_minutes_over_duty_pct", "moves_per_hour",
                "gpu_hours_saved_pct"} <= set(p)
    assert plot.stat().st_size > 1000


@pytest.mark.parametrize("argv, message", [
    (["--gpu-memory", "0"], "argument --gpu-memory: size must be above zero, got '0'"),
    (["--gpu-memory", "80"], "argument --gpu-memory: size '80' has no unit: give one, e.g. 80GB"),
    (["--gpu-memory", "0GB"], "argument --gpu-memory: size must be above zero"),
    (["--gpu-memory", "80GX"], "unknown unit 'GX'"),
    (["--sharing-policies", "best"], "unknown sharing policy"),
    (["--repack-steps", "0"], "--repack-steps"),
    (["--memory-quantile", "1.5"], "--memory-quantile"),
    (["--guard-quantile", "1"], "--guard-quantile"),
    (["--guard-margin", "-0.1"], "--guard-margin"),
])
def test_cli_bad_options_name_the_flag(capsys, small_alibaba_dir, argv, message):
    try:
        code = main(["simulate", "sharing", "--quiet", "--data", str(small_alibaba_dir), *argv])
    except SystemExit as exc:  # argparse's usage error (a size it cannot read)
        code = exc.code
    assert code == 2 and message in capsys.readouterr().err


def test_sticky_repacking_moves_no_more_pods_for_no_more_gpus(series):
    filled = (series.filled(series.memory), series.filled(series.duty))
    runs = [simulate_sharing(series, PeakOfHistory(126), 60 * GB, 10, filled=filled, sticky=s) for s in (False, True)]
    fresh, sticky = (r.report() for r in runs)
    assert sticky["moves_per_hour"] <= fresh["moves_per_hour"]
    assert runs[1].gpus[::10].sum() <= runs[0].gpus[::10].sum()  # at each repack, no more GPUs


def test_rss_burst_room_packs_independent_bursts_tighter_than_their_sum_but_not_the_largest_alone():
    from dprobe.sharing.planner import Workload, plan

    # three pods of 20 GB with 10 GB bursts on 80 GB: one burst at a time (max) fits all three (60 + 10),
    # every burst at once (overlap 1) needs 90, the root of the sum of squares needs 60 + 17.3 = 77.3
    work = [Workload(f"p{i}", 20 * GB, memory_burst_bytes=10 * GB) for i in range(3)]
    assert plan(work, 80 * GB, settings=PlanSettings(burst_overlap=1.0)).gpus_used == 2
    assert plan(work, 80 * GB, settings=PlanSettings(burst_combine="rss")).gpus_used == 1
    four = work + [Workload("p3", 20 * GB, memory_burst_bytes=10 * GB)]  # 80 + 20 > 80 either way; max: 80 + 10
    assert plan(four, 80 * GB, settings=PlanSettings(burst_combine="rss")).gpus_used == 2
    # one large burst beside small ones: rss keeps at least the largest burst's room
    big = [Workload("a", 30 * GB, memory_burst_bytes=25 * GB), Workload("b", 30 * GB, memory_burst_bytes=1 * GB)]
    assert plan(big, 80 * GB, settings=PlanSettings(burst_combine="rss")).gpus_used == 2  # 60 + 25.02 > 80
    with pytest.raises(ValueError, match="burst_combine"):
        PlanSettings(burst_combine="sum")


def test_cli_burst_combine_is_reported_and_checked(capsys, small_alibaba_dir):
    code = main(["simulate", "sharing", "--quiet", "--data", str(small_alibaba_dir), "--json",
                 "--sharing-policies", "one-per-gpu,last-value", "--burst-combine", "rss"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out)["settings"]["burst_combine"] == "rss"
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "sharing", "--quiet", "--data", str(small_alibaba_dir), "--burst-combine", "sum"])
    assert exit_.value.code == 2 and "--burst-combine" in capsys.readouterr().err


def _last_value_policy():
    from dprobe.forecaster.baselines import make_baseline
    from dprobe.sim.sharing.packing import ForecastDemand

    base = make_baseline("last_value")
    base.residual_window = 40
    return ForecastDemand("last-value", base, 70, memory_quantile=0.5, duty_quantile=0.9, burst_quantile=0.99,
                          burst_history=126)


def test_hindsight_on_burst_heights_with_every_burst_at_once_never_overflows(series):
    from dprobe.sim.sharing.packing import PartialHindsight

    filled = (series.filled(series.memory), series.filled(series.duty))
    policy = PartialHindsight(_last_value_policy(), filled[0], "burst")
    ref = simulate_sharing(series, OnePerGpu(), 60 * GB, 30, filled=filled).report()["gpu_hours"]
    r = simulate_sharing(series, policy, 60 * GB, 30, PlanSettings(burst_overlap=1.0), filled).report(ref)
    peak = simulate_sharing(series, PeakOfHistory(126), 60 * GB, 30, filled=filled).report(ref)
    assert peak["pod_minutes_over_memory_pct"] > 0  # pods share here, and sharing by history overflows
    assert r["pod_minutes_over_memory_pct"] == 0.0 and r["gpu_hours_saved_pct"] > 20
    pods = np.flatnonzero((series.scored_from <= series.eval_start) & (series.scored_to > series.eval_start + 30))
    mem, _, burst = policy.demand(series, pods, series.eval_start, 30)
    assert np.allclose(mem + burst, np.maximum(mem, filled[0][pods, series.eval_start:series.eval_start + 30].max(1)))


def test_hindsight_level_sizes_each_pod_at_its_coming_median(series):
    from dprobe.sim.sharing.packing import PartialHindsight

    filled = series.filled(series.memory)
    base = _last_value_policy()
    t = series.eval_start
    pods = np.flatnonzero((series.scored_from <= t) & (series.scored_to > t + 30))
    mem, _, burst = PartialHindsight(base, filled, "level").demand(series, pods, t, 30)
    assert np.allclose(mem, np.median(filled[pods, t:t + 30], 1))
    top = np.add(*base.demand(series, pods, t, 30)[::2])
    assert np.allclose(mem + burst, np.maximum(top, mem))
    with pytest.raises(ValueError, match="part"):
        PartialHindsight(base, filled, "duty")


# --- guarded peak packing, the shared entry point and the cross-validation -----------------------------------


class _Fixed:
    """A forecaster that forecasts each pod's ``high[pod]`` bytes (every quantile, every lead) whatever its
    history: where the guard sees a pod going next."""

    name = "fixed"

    def __init__(self, by_last_value: dict[float, float]) -> None:
        self.by_last_value = by_last_value

    def predict(self, batch):
        from dprobe.forecaster.base import Forecast

        last = np.array([row[np.isfinite(row)][-1] for row in batch.values])
        high = np.array([self.by_last_value.get(float(v), float(v)) for v in last])
        q = np.repeat(high[:, None, None], len(batch.leads), 1).repeat(3, 2)
        return Forecast(q[..., 0], q, batch.leads, (0.5, 0.9, 0.99))


def _pods(levels: list[list[float]], steps_each: list[int] | None = None, step_seconds: float = 60.0):
    """A :class:`PodSeries` of pods holding ``levels[p]`` GB in equal runs over 100 steps; scored from step 50."""
    from dprobe.sim.sharing.packing import PodSeries

    n, steps = len(levels), 100
    memory = np.zeros((n, steps))
    for p, runs in enumerate(levels):
        for k, chunk in enumerate(np.array_split(np.arange(steps), len(runs))):
            memory[p, chunk] = runs[k] * GB
    first, end = np.zeros(n, dtype=np.int64), np.full(n, steps, dtype=np.int64)
    return PodSeries([f"pod{p:03d}" for p in range(n)], memory, np.full((n, steps), 10.0), np.zeros((n, steps, 0)),
                     (), first, end, np.full(n, 50), end.copy(), 50, steps, step_seconds, np.full(n, 50))


def _guard(series, high: dict[float, float], mode: str = "free"):
    from dprobe.sim.sharing.packing import ForecastDemand, GuardedPeak

    return GuardedPeak("dprobe", PeakOfHistory(40), ForecastDemand("f", _Fixed(high), 40, 0.5, 0.9), 0.99, 0.0, mode)


def test_guarded_peak_repairs_the_peak_plan_where_that_costs_no_gpu():
    # peak packing on 100 GB: a (60) with b (30), c (30) alone; b jumps to 45 from step 50, which the
    # guard's forecast sees: moving b beside c keeps two GPUs and no pod over memory
    series = _pods([[60], [30, 45], [30]])
    peak = simulate_sharing(series, PeakOfHistory(40), 100 * GB, 25)
    guarded = simulate_sharing(series, _guard(series, {30e9: 45e9}), 100 * GB, 25)
    assert peak.pods_over_memory.sum() > 0 and guarded.pods_over_memory.sum() == 0
    assert np.array_equal(guarded.gpus, peak.gpus) and guarded.gpus.max() == 2


def test_a_guard_that_would_cost_a_gpu_leaves_peak_packing_as_it_is():
    # every pod forecast at 60 GB: no repair fits in peak packing's GPUs, so the plan is peak packing's, GPU
    # for GPU and pod for pod (the overflow too), where the guard at any cost takes a GPU per pod
    series = _pods([[30, 45], [30], [30]])
    high = {30e9: 60e9, 45e9: 60e9}
    peak = simulate_sharing(series, PeakOfHistory(40), 100 * GB, 25)
    free = simulate_sharing(series, _guard(series, high), 100 * GB, 25)
    always = simulate_sharing(series, _guard(series, high, "always"), 100 * GB, 25)
    assert np.array_equal(free.gpus, peak.gpus) and np.array_equal(free.pods_over_memory, peak.pods_over_memory)
    assert always.gpus.sum() > peak.gpus.sum()


@pytest.mark.slow
def test_guarded_peak_never_needs_more_gpus_than_peak_packing_at_a_repack(series):
    from dprobe.forecaster.baselines import make_baseline
    from dprobe.sim.sharing.packing import ForecastDemand, GuardedPeak

    base = make_baseline("last_value")
    base.residual_window = 40
    filled = (series.filled(series.memory), series.filled(series.duty))
    for gb, q in ((45, 0.99), (60, 0.9), (80, 0.99)):
        guard = GuardedPeak("dprobe", PeakOfHistory(126), ForecastDemand("lv", base, 70, 0.5, 0.9), q, 0.2)
        peak = simulate_sharing(series, PeakOfHistory(126), gb * GB, 10, filled=filled)
        guarded = simulate_sharing(series, guard, gb * GB, 10, filled=filled)
        assert np.all(guarded.gpus[::10] <= peak.gpus[::10]), gb


def _toy_scores(over: dict[str, list[int]], gpu: dict[str, list[int]] | None = None):
    """Scores of the cells g0..g2 x s0..s1 (one pod each, 10 steps) from per-cell overflow steps."""
    from dprobe.sim.sharing.cv import Cell, Score

    cells = [Cell(g, s, None) for s in range(2) for g in range(3)]
    scores = {}
    for label, per_cell in over.items():
        for c, o in zip(cells, per_cell, strict=True):
            g = (gpu or {}).get(label, [5] * len(cells))[cells.index(c)]
            for size in (80 * 10**9, 141 * 10**9):
                scores[label, c.name, size] = Score(np.array([0]), np.array([float(g)]), np.array([10]),
                                                    np.array([o]))
    return cells, scores


def test_the_choice_is_never_worse_than_peak_on_its_selection_cells_and_never_looks_at_the_held_out_one():
    from dprobe.sim.sharing.cv import choose, selection_cells

    # "x": least overflow in all but loses to peak in cell g1/s0; "y": never loses, a little better than peak
    cells, scores = _toy_scores({"peak": [2, 2, 2, 2, 2, 2], "x": [0, 5, 0, 0, 0, 0], "y": [1, 2, 2, 2, 2, 2]})
    labels = ["peak", "x", "y"]
    assert choose(scores, labels, cells) == "y"
    g1s0, g0s1 = cells[1], cells[3]
    assert choose(scores, labels, cells, held_out=g1s0) == "x"  # the cell x loses in is held out
    assert [c.name for c in selection_cells(cells, g0s1)] == ["g1/s0", "g2/s0"]
    before = choose(scores, labels, cells, held_out=g0s1)
    for size in (80 * 10**9, 141 * 10**9):  # what happens on the held-out cell changes nothing
        scores["peak", g0s1.name, size].over[:] = 0
        scores["y", g0s1.name, size].over[:] = 9
    assert choose(scores, labels, cells, held_out=g0s1) == before
    # a setting that saves memory overflow by using more GPUs is not eligible
    cells, scores = _toy_scores({"peak": [2] * 6, "z": [0] * 6}, gpu={"peak": [5] * 6, "z": [6] * 6})
    assert choose(scores, ["peak", "z"], cells) == "peak"
    with pytest.raises(ValueError, match="reference"):
        choose(scores, ["z"], cells)


def test_cv_folds_never_put_a_pod_or_an_hour_in_both_selection_and_report_sets():
    from dprobe.sim.sharing.cv import cells, pod_group, selection_cells

    series = _pods([[20 + p % 7] for p in range(40)])
    series.unseen_from[:] = 60
    folds = cells(series, groups=4, spans=((0.5, 0.75), (0.75, 1.0)))
    assert len(folds) == 8
    covered = np.zeros((40, 100), dtype=int)
    for c in folds:
        s = c.series
        assert np.all(s.scored_from[c.pods()] >= 60) and np.all(s.scored_to[c.pods()] <= s.eval_end)
        assert {pod_group(series.ids[p], 4) for p in c.pods()} == {c.group}
        for p in c.pods():
            covered[p, s.scored_from[p]:s.scored_to[p]] += 1
        chosen_on = selection_cells(folds, c)
        assert chosen_on and not any(c.group == o.group or c.span == o.span for o in chosen_on)
        on_pods = np.concatenate([o.pods() for o in chosen_on])
        assert not set(on_pods) & set(c.pods())
        on_steps = set().union(*(range(o.series.eval_start, o.series.eval_end) for o in chosen_on))
        assert not on_steps & set(range(s.eval_start, s.eval_end))
    assert covered[:, 60:].min() == 1 and covered.max() == 1 and covered[:, :60].sum() == 0  # each once


def test_pooled_bootstrap_totals_and_a_policy_paired_with_itself():
    from dprobe.sim.sharing.cv import Score, cell_bootstrap, pooled_bootstrap

    cells, scores = _toy_scores({"peak": [1, 0, 3, 0, 0, 2]})
    per_cell = {c.name: scores["peak", c.name, 80 * 10**9] for c in cells}
    out = pooled_bootstrap(per_cell, cells, 1, per_cell, draws=200)
    assert out["gpu_hours_saved_pct"] == pytest.approx(50.0)
    assert out["pod_minutes_over_memory_pct"] == pytest.approx(100 * 6 / 60)
    assert out["saved_minus_reference_ci"] == (0.0, 0.0) and out["over_minus_reference_ci"] == (0.0, 0.0)
    lo, hi = out["pod_minutes_over_memory_ci"]
    assert lo <= out["pod_minutes_over_memory_pct"] <= hi
    one = cell_bootstrap(Score(np.arange(4), np.array([1.0, 2, 3, 4]), np.array([4, 4, 4, 4]),
                               np.array([0, 0, 0, 4])))
    assert one["gpu_hours_saved_pct"] == pytest.approx(100 * (1 - 10 / 16))
    assert one["pod_minutes_over_memory_ci"][0] == 0.0 and one["pod_minutes_over_memory_ci"][1] > 0


def _cli_defaults():
    import argparse

    from dprobe.sim.cli import register
    from dprobe.sim.sharing.cli import sharing_settings

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return sharing_settings(parser.parse_args(["simulate", "sharing"]))


def test_cli_default_is_the_shipped_default_and_the_benchmarks(monkeypatch, script, small_alibaba_dir):
    from dprobe.sim.sharing import cv as sharing_cv
    from dprobe.sim.sharing.packing import SharingSettings

    assert _cli_defaults() == SharingSettings()
    assert SharingSettings().rule == "guarded-peak" and SharingSettings().guard_mode == "free"
    seen = {}

    def spy(series, sizes, groups, **kw):
        seen.update(kw)
        raise SystemExit(0)

    monkeypatch.setattr(sharing_cv, "cross_validate", spy)
    monkeypatch.setattr("dprobe.sim.sharing.packing.load_forecaster", lambda checkpoint=None: None)
    with pytest.raises(SystemExit):
        script("benchmarks/simulate_sharing.py").main(["--json", "--data", str(small_alibaba_dir)])
    assert seen["shipped"] == SharingSettings()
    assert sharing_cv.candidates()[0].label == "peak"
    assert [c.label for c in sharing_cv.candidates() if c.settings == SharingSettings()] == \
        ["guarded-peak free p99+0%"]


@pytest.mark.slow
def test_cli_rows_are_simulate_policies_results(capsys, small_alibaba_dir):
    from dprobe.sim.sharing.packing import SharingSettings, load_forecaster, simulate_policies

    code = main(["simulate", "sharing", "--quiet", "--data", str(small_alibaba_dir), "--json", "--gpu-memory", "60GB",
                 "--sharing-policies", "one-per-gpu,peak,dprobe"])
    out = capsys.readouterr()
    assert code == 0, out.err
    report = json.loads(out.out)
    settings = SharingSettings(gpu_memory_bytes=60 * 10**9)
    assert {k: report["settings"][k] for k in settings.to_dict()} == settings.to_dict()
    s = pod_series(load_alibaba(small_alibaba_dir))
    runs = simulate_policies(s, settings, ("one-per-gpu", "peak", "dprobe"), load_forecaster())
    ref = runs[0].report()["gpu_hours"]
    assert report["policies"] == json.loads(json.dumps([r.report(ref) for r in runs]))


class _FixedModel(_Fixed):
    """:class:`_Fixed` as a loaded checkpoint: what ``simulate_policies`` asks a forecaster for."""

    def task_for(self, metric, step_seconds):
        from types import SimpleNamespace

        return None, SimpleNamespace(covariates=(), leads=(25,), step_seconds=step_seconds), None

    def window_seconds(self, metric):
        return 40 * 60.0


def test_shipped_default_never_loses_to_peak_packing_on_a_synthetic_fold_set():
    from types import SimpleNamespace

    from dprobe.sim.sharing.cv import Candidate, cross_validate
    from dprobe.sim.sharing.packing import SharingSettings

    # 10 pods at 30 GB that go to 45 GB at step 60 (which the forecast sees coming), 20 steady pods at 20 GB;
    # peak packing puts the 30s together, and they overflow once they jump
    series = _pods([[30, 30, 30, 45, 45] if p % 3 == 0 else [20] for p in range(30)])
    loaded = SimpleNamespace(forecaster=_FixedModel({30e9: 45e9}), kind="fixed", checkpoint="")
    choices = [Candidate("peak", SharingSettings(rule="peak")), Candidate("shipped", SharingSettings())]
    out = cross_validate(series, sizes=(100 * 10**9,), groups=3, spans=((0.5, 0.75), (0.75, 1.0)),
                         choices=choices, forecaster=loaded, draws=100, shipped=SharingSettings(repack_steps=25))
    assert out["default_never_loses"] and len(out["cells"]) == 6
    for c in out["cells"]:  # GPU for GPU peak packing's, never more overflow (the forecast is right here)
        f = c["sizes"][str(100 * 10**9)]
        assert f["dprobe"]["gpu_hours_saved_pct"] == pytest.approx(f["peak"]["gpu_hours_saved_pct"])
        assert f["dprobe"]["pod_minutes_over_memory_pct"] <= f["peak"]["pod_minutes_over_memory_pct"]
    pooled = out["overall"][str(100 * 10**9)]
    assert 0 <= pooled["dprobe"]["pod_minutes_over_memory_pct"] < pooled["peak"]["pod_minutes_over_memory_pct"]
    assert pooled["dprobe"]["saved_minus_reference"] == pytest.approx(0.0)
    assert pooled["dprobe"]["over_minus_reference"] < 0


@pytest.mark.slow
def test_shipped_default_never_loses_to_peak_packing_on_a_fold_set(small_alibaba_dir):
    from dprobe.sim.sharing.cv import Candidate, cross_validate
    from dprobe.sim.sharing.packing import SharingSettings

    s = pod_series(load_alibaba(small_alibaba_dir))
    choices = [Candidate("peak", SharingSettings(rule="peak")), Candidate("shipped", SharingSettings())]
    out = cross_validate(s, sizes=(50 * 10**9, 80 * 10**9, 141 * 10**9), groups=2, choices=choices, draws=100)
    assert out["shipped_label"] == "shipped" and out["default_never_loses"]
    assert len(out["cells"]) >= 4
    for size in (str(n * 10**9) for n in (50, 80, 141)):
        pooled = out["overall"][size]
        assert pooled["dprobe"]["gpu_hours_saved_pct"] == pytest.approx(pooled["peak"]["gpu_hours_saved_pct"])
        assert pooled["dprobe"]["pod_minutes_over_memory_pct"] <= pooled["peak"]["pod_minutes_over_memory_pct"]
