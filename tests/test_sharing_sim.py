"""`dprobe simulate --sharing`: pods packed onto shared GPUs, scored against what they did (dprobe.sim.sharing)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dprobe.cli import main
from dprobe.data.alibaba import load_alibaba
from dprobe.sharing.planner import PlanSettings
from dprobe.sim.sharing import OnePerGpu, Oracle, PeakOfHistory, _match, pod_series, simulate_sharing

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
    code = main(["simulate", "--sharing", "--quiet", "--data", str(small_alibaba_dir), "--gpu-memory", "48",
                 "--sharing-policies", "one-per-gpu,peak,oracle", "--packing", "first-fit"])
    out = capsys.readouterr().out
    assert code == 0
    assert "GPUs of 48 GB" in out and "| oracle |" in out and "| peak-2h |" in out and "scaled" in out


@pytest.mark.slow
def test_cli_json_and_plot(capsys, small_alibaba_dir, tmp_path):
    plot = tmp_path / "sharing.png"
    code = main(["simulate", "--sharing", "--quiet", "--data", str(small_alibaba_dir), "--json", "--gpu-memory", "141",
                 "--plot", str(plot)])
    out = capsys.readouterr()
    assert code == 0, out.err
    report = json.loads(out.out)
    assert [p["policy"] for p in report["policies"]] == ["one-per-gpu", "peak-2h", "peak-2h+10%", "last-value",
                                                         "dprobe", "oracle"]
    assert report["settings"]["gpu_memory_gb"] == 141 and "scaled" in report["note"]
    assert report["forecaster"].startswith("dprobe-forecaster")
    for p in report["policies"]:
        assert {"gpu_hours", "pod_minutes_over_memory_pct", "gpu_minutes_over_duty_pct", "moves_per_hour",
                "gpu_hours_saved_pct"} <= set(p)
    assert plot.stat().st_size > 1000


@pytest.mark.parametrize("argv, message", [
    (["--gpu-memory", "0"], "--gpu-memory"),
    (["--sharing-policies", "best"], "unknown sharing policy"),
    (["--repack-steps", "0"], "--repack-steps"),
    (["--memory-quantile", "1.5"], "--memory-quantile"),
    (["--fixed"], "--fixed"),
])
def test_cli_bad_options_name_the_flag(capsys, small_alibaba_dir, argv, message):
    code = main(["simulate", "--sharing", "--quiet", "--data", str(small_alibaba_dir), *argv])
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
    code = main(["simulate", "--sharing", "--quiet", "--data", str(small_alibaba_dir), "--json",
                 "--sharing-policies", "one-per-gpu,last-value", "--burst-combine", "rss"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out)["settings"]["burst_combine"] == "rss"
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--sharing", "--quiet", "--data", str(small_alibaba_dir), "--burst-combine", "sum"])
    assert exit_.value.code == 2 and "--burst-combine" in capsys.readouterr().err


def _last_value_policy():
    from dprobe.forecaster.baselines import make_baseline
    from dprobe.sim.sharing import ForecastDemand

    base = make_baseline("last_value")
    base.residual_window = 40
    return ForecastDemand("last-value", base, 70, memory_quantile=0.5, duty_quantile=0.9, burst_quantile=0.99,
                          burst_history=126)


def test_hindsight_on_burst_heights_with_every_burst_at_once_never_overflows(series):
    from dprobe.sim.sharing import PartialHindsight

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
    from dprobe.sim.sharing import PartialHindsight

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
