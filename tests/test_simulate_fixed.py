"""``dprobe simulate fixed``: the fixed-size cluster on small hand-made job logs whose right answer is
known, the five scheduling policies, quota lending and reclaim, the quota policies and the CLI."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dprobe.cli import main
from dprobe.forecaster.base import QUANTILES, Forecast, ForecastInput
from dprobe.sim.fixed.cli import concurrent_demand, default_gpus
from dprobe.sim.fixed.cluster import (
    OVER_CLUSTER,
    OVER_VC,
    FixedCluster,
    FixedConfig,
    FixedResult,
    Nodes,
    simulate_fixed,
)
from dprobe.sim.fixed.quota_split import (
    ForecastShares,
    Lending,
    StaticShares,
    first_half_gpu_time,
    normalise,
    split_total,
    static_shares,
    wants,
)
from dprobe.sim.fixed.report import reduction, targets
from dprobe.sim.fixed.scheduling import (
    DEMOTE,
    SCHEDULING_NAMES,
    STRATEGIES,
    DurationEstimator,
    Scheduling,
    Tiresias,
    reservation,
)
from dprobe.sim.helios_jobs import DeriveStats, derive_class, derive_jobs
from dprobe.sim.jobs import JobTable
from dprobe.sim.policies import ForecastQuota, ScalerSettings


def config(gpus: int, per_node: int | None = None, scheduling: str = "fifo", **kw) -> FixedConfig:
    return FixedConfig(gpus=gpus, gpus_per_node=per_node or gpus, scheduling=Scheduling(scheduling, **kw.pop(
        "sched", {})), **kw)


def one_vc(*jobs: tuple[float, float, int]) -> JobTable:
    """Jobs ``(submit, duration, gpus)`` of a single VC "a"."""
    return JobTable.from_lists([("a", s, d, g) for s, d, g in jobs])


def run_one(jobs: JobTable, gpus: int, scheduling: str = "fifo", per_node: int | None = None,
            users: list[str] | None = None, **kw) -> FixedResult:
    return simulate_fixed(jobs, StaticShares(np.array([gpus])), config(gpus, per_node, scheduling, **kw),
                          users=users)


# --- placement -------------------------------------------------------------------------------------------

def test_a_job_goes_on_as_few_nodes_as_possible() -> None:
    nodes = Nodes(24, 8)
    first = nodes.place(3)
    assert len(first) == 1 and first[0][1] == 3
    second = nodes.place(4)
    assert second == [(first[0][0], 4)]  # the fullest node that fits: the one already holding 3
    big = nodes.place(12)  # one whole node and 4 on another
    assert sorted(g for _, g in big) == [4, 8] and len({n for n, _ in big}) == 2
    assert nodes.free == 24 - 19
    assert nodes.place(5) is None  # 5 GPUs free, but on two nodes (1 + 4)
    nodes.release(big)
    assert nodes.free == 17 and nodes.place(16) is not None


def test_a_job_waits_for_a_node_with_room_although_enough_gpus_are_free() -> None:
    # two nodes of 4: jobs of 3 on each leave 1 + 1 free; the 2-GPU job waits for the first to end
    r = run_one(one_vc((0, 100, 3), (0, 200, 3), (1, 10, 2)), 8, per_node=4, scheduling="easy")
    assert r.first_start.tolist() == [0, 0, 100]


# --- scheduling within a VC ------------------------------------------------------------------------------

def test_fifo_and_sjf_order_on_one_gpu() -> None:
    jobs = one_vc((0, 100, 1), (1, 50, 1), (2, 10, 1), (3, 30, 1))
    assert run_one(jobs, 1, "fifo").first_start.tolist() == [0, 100, 150, 160]
    assert run_one(jobs, 1, "sjf").first_start.tolist() == [0, 140, 100, 110]  # 10, 30, then 50


def test_fifo_head_blocks_and_a_job_bigger_than_the_vc_is_excluded_and_counted() -> None:
    jobs = one_vc((0, 100, 3), (1, 100, 2), (2, 10, 1), (3, 5, 8))
    r = run_one(jobs, 4, "fifo")
    assert r.first_start[:3].tolist() == [0, 100, 100]  # the 1-GPU job does not pass the 2-GPU head
    assert r.excluded.tolist() == [0, 0, 0, OVER_CLUSTER] and np.isnan(r.waits()[3])


def test_qssf_orders_by_the_users_past_durations() -> None:
    # u1's finished job ran 50 s, u2's 500 s; their next jobs queue behind a 1000-s job, u2's first
    history = [(0, 50, 1), (0, 500, 1)]
    jobs = one_vc(*history, (600, 1000, 1), (700, 5, 1), (701, 5, 1))
    users = ["u1", "u2", "x", "u2", "u1"]
    r = run_one(jobs, 1, "qssf", users=users)
    assert r.first_start[3:].tolist() == [1605, 1600]  # u1's job (estimated 50 s) first
    fifo = run_one(jobs, 1, "fifo", users=users)
    assert fifo.first_start[3:].tolist() == [1600, 1605]


def test_duration_estimator_falls_back_from_user_to_vc_to_cluster() -> None:
    est = DurationEstimator()
    assert est.estimate("u", 0, 1) == 3600.0  # nothing finished yet
    est.observe("u", 0, 1, 100.0)
    est.observe("v", 0, 4, 300.0)
    est.observe(None, 1, 2, 1000.0)
    assert est.estimate("u", 0, 1) == 100.0  # same user, same GPU count
    assert est.estimate("u", 0, 8) == 100.0  # same user
    assert est.estimate("w", 0, 4) == 300.0  # the VC's jobs of 4 GPUs
    assert est.estimate(None, 0, 2) == 200.0  # the VC's jobs
    assert est.estimate(None, 5, 1) == pytest.approx(1400 / 3)  # every finished job


def test_tiresias_preempts_a_job_that_has_received_more_service() -> None:
    # A (1000 s) has received 200 GPU-s when B arrives; with a 100 GPU-s threshold A is in the lower
    # queue, so B preempts it; A resumes when B ends, paying the 10-s restart cost
    jobs = one_vc((0, 1000, 1), (200, 50, 1))
    r = run_one(jobs, 1, "tiresias", restart_cost=10.0, sched={"las_thresholds": (100.0,)})
    assert r.first_start.tolist() == [0, 200]
    assert r.end.tolist() == [1060, 250]  # A: 200 s, preempted, then 800 s + 10 s from 250
    assert r.preemptions.tolist() == [1, 0] and r.las_preemptions == 1
    assert r.queued_seconds.tolist() == [50, 0]  # A waited while B ran
    assert r.restart_gpu_seconds == 10
    fifo = run_one(jobs, 1, "fifo")
    assert fifo.first_start.tolist() == [0, 1000] and fifo.las_preemptions == 0


def test_tiresias_does_not_preempt_within_the_same_queue() -> None:
    r = run_one(one_vc((0, 1000, 1), (50, 50, 1)), 1, "tiresias", sched={"las_thresholds": (10000.0,)})
    assert r.first_start.tolist() == [0, 1000] and r.las_preemptions == 0
    # with a threshold of 100 GPU-s, the running job is demoted at 100 s and the queued one preempts it
    r = run_one(one_vc((0, 1000, 1), (50, 50, 1)), 1, "tiresias", sched={"las_thresholds": (100.0,)})
    assert r.first_start.tolist() == [0, 100] and r.las_preemptions == 1


def test_a_demotion_less_than_a_float_step_away_is_not_scheduled_at_now() -> None:
    # a 64-GPU job 4e-6 GPU-s short of the threshold crosses it 6e-8 s on: at an epoch-second clock that
    # rounds to now, and the demotion would be scheduled at now for ever
    now = 1588295185.7142856
    jobs = one_vc((now, 10000, 64))
    c = FixedCluster(jobs, StaticShares(np.array([64])), config(64, 8, "tiresias"), None, now)
    c.run_start[0], c.attained[0], c.remaining[0] = now, 18000.0 - 4e-6, 10000.0
    assert isinstance(c.strategy, Tiresias)
    c.strategy.schedule_demotion(c, 0, now)
    assert [e[:3] for e in c.events] == [(now + 1e-3, DEMOTE, 0)]


def test_tiresias_starvation_guard_promotes_a_job_that_waited_too_long() -> None:
    # A (300 s) runs 200 s, is demoted at 100 GPU-s and preempted at 200 by a stream of 50-s jobs
    # (each stays in the highest queue) that would keep it queued until the stream ends at 5200
    stream = [(200 + 50 * k, 50, 1) for k in range(100)]
    jobs = one_vc((0, 300, 1), *stream)

    def run(limit: float) -> FixedResult:
        return run_one(jobs, 1, "tiresias", restart_cost=0.0,
                       sched={"las_thresholds": (100.0,), "starve_limit": limit})

    never = run(0.0)
    assert never.end[0] == 5300 and never.promotions == 0 and never.queued_seconds[0] == 5000
    once = run(1.0)  # waited as long as it ran (200 s): promoted at 400, runs its last 100 s
    assert once.end[0] == 500 and once.promotions == 1 and once.queued_seconds[0] == 200
    assert once.queued_seconds[1:].max() == 100  # the stream's jobs wait those 100 s
    twice = run(2.0)  # promoted after 400 s
    assert twice.end[0] == 700 and twice.queued_seconds[0] == 400
    assert run_one(jobs, 1, "fifo").promotions == 0


def test_easy_backfills_a_short_job_without_delaying_the_head() -> None:
    # earlier jobs teach the estimator: u1's jobs run 50 s, u2's 500 s
    history = [(0, 50, 1), (0, 500, 1)]
    jobs = one_vc(*history, (1000, 100, 3), (1001, 100, 4), (1002, 50, 1), (1003, 500, 1))
    users = ["u1", "u2", "x", "head", "u1", "u2"]
    easy = run_one(jobs, 4, "easy", users=users)
    # the estimator says the 3-GPU job runs as the two before it (mean 275 s), so the head's
    # reservation is at 1275; u1's 50-s job fits before it, u2's 500-s job does not
    assert easy.first_start[2:].tolist() == [1000, 1100, 1002, 1200]
    assert easy.first_start[3] == run_one(jobs, 4, "fifo", users=users).first_start[3]  # head not delayed
    fifo = run_one(jobs, 4, "fifo", users=users)
    assert fifo.first_start[4] == 1200  # FIFO holds the short job behind the head


def test_easy_reservation() -> None:
    assert reservation(0.0, 4, 1, [(100.0, 2), (50.0, 1)]) == (100.0, 0)
    assert reservation(0.0, 2, 3, []) == (0.0, 1)
    assert reservation(10.0, 4, 0, [(5.0, 4)]) == (10.0, 0)  # an estimate already past ends now
    assert reservation(0.0, 9, 1, [(5.0, 4)]) == (float("inf"), 0)


def test_bad_scheduling_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown scheduling policy 'srtf'"):
        Scheduling("srtf")
    with pytest.raises(ValueError, match="increasing positive GPU-seconds"):
        Scheduling("tiresias", las_thresholds=(100.0, 50.0))
    with pytest.raises(ValueError, match="--starve-limit must be a number >= 0"):
        Scheduling("tiresias", starve_limit=-1.0)
    with pytest.raises(ValueError, match="multiple of --gpus-per-node"):
        FixedConfig(gpus=10, gpus_per_node=8)


def test_every_scheduling_policy_is_a_strategy_the_cluster_calls() -> None:
    assert set(STRATEGIES) == set(SCHEDULING_NAMES)
    jobs = one_vc((0, 100, 1), (0, 50, 1))
    for name in SCHEDULING_NAMES:
        c = FixedCluster(jobs, StaticShares(np.array([1])), config(1, scheduling=name), None, 0.0)
        assert type(c.strategy) is STRATEGIES[name] and c.strategy.sched.name == name
    # the queue keys: submission order (fifo, easy), logged duration (sjf), estimated GPU-time (qssf)
    c = FixedCluster(jobs, StaticShares(np.array([1])), config(1, scheduling="sjf"), None, 0.0)
    assert [c.strategy.key(c, j) for j in (0, 1)] == [100.0, 50.0]
    c = FixedCluster(jobs, StaticShares(np.array([1])), config(1, scheduling="easy"), None, 0.0)
    assert [c.strategy.key(c, j) for j in (0, 1)] == [0.0, 1.0]


# --- quotas: static, lending, reclaim, forecast ------------------------------------------------------------

def two_vcs() -> JobTable:
    """VC a: four 1-GPU jobs of 1000 s at 0; VC b: one 2-GPU job of 10 s at 100."""
    return JobTable.from_lists([*[("a", 0, 1000, 1)] * 4, ("b", 100, 10, 2)])


def test_static_quotas_never_lend() -> None:
    r = simulate_fixed(two_vcs(), StaticShares(np.array([2, 2])), config(4))
    assert r.first_start.tolist() == [0, 0, 1000, 1000, 100]
    assert r.lent_gpu_seconds == 0


def test_idle_gpus_are_lent_and_reclaimed_by_waiting() -> None:
    r = simulate_fixed(two_vcs(), Lending(np.array([2, 2])), config(4, lend_delay=0.0))
    assert r.first_start.tolist() == [0, 0, 0, 0, 1000]  # b waits for its GPUs to come back
    assert r.lent_gpu_seconds == 2 * 1000 and r.reclaim_preemptions == 0


def test_lent_gpus_are_reclaimed_by_preemption_with_a_restart_cost() -> None:
    r = simulate_fixed(two_vcs(), Lending(np.array([2, 2])), config(4, lend_delay=0.0, preempt=True,
                                                                     restart_cost=60.0))
    assert r.first_start[4] == 100 and r.reclaim_preemptions == 2
    assert r.preemptions.tolist() == [0, 0, 1, 1, 0]  # the borrowing jobs, not the two within a's quota
    assert r.end[2:4].tolist() == [1070, 1070]  # 100 s, then 900 s + 60 s from 110
    assert r.queued_seconds[2:4].tolist() == [10, 10]
    assert r.lent_gpu_seconds == 2 * 100 + 2 * (1000 - 110)  # within a's quota once its first two end


def test_gpus_are_lent_only_after_the_lending_delay() -> None:
    r = simulate_fixed(two_vcs(), Lending(np.array([2, 2])), config(4, lend_delay=300.0))
    # b's job runs on its own quota at 100; b's GPUs are idle again from 110, so lent from 410
    assert r.first_start.tolist() == [0, 0, 410, 410, 100]


def test_a_job_bigger_than_its_static_quota_is_excluded_but_runs_with_lending() -> None:
    jobs = JobTable.from_lists([("a", 0, 10, 3), ("b", 0, 10, 1)])
    static = simulate_fixed(jobs, StaticShares(np.array([2, 2])), config(4))
    assert static.excluded.tolist() == [OVER_VC, 0]
    lending = simulate_fixed(jobs, Lending(np.array([2, 2])), config(4, lend_delay=0.0))
    assert lending.excluded.tolist() == [0, 0] and lending.first_start.tolist() == [0, 0]


def test_static_shares_follow_the_first_half_gpu_time() -> None:
    # a: 1 GPU for 100 s, b: 3 GPUs for 100 s in the first half; c only in the second
    jobs = JobTable.from_lists([("a", 0, 100, 1), ("b", 0, 100, 3), ("c", 1000, 100, 8)])
    assert first_half_gpu_time(jobs).tolist() == [100, 300, 0]
    assert static_shares(jobs, 16).tolist() == [4, 12, 0]
    assert split_total(10, np.array([1, 1, 1])).tolist() == [4, 3, 3]
    assert split_total(5, np.zeros(2)).tolist() == [3, 2]


def test_normalise_scales_down_or_tops_up_to_the_total() -> None:
    shares = np.array([3, 1])
    assert normalise(np.array([12, 4]), 8, shares).tolist() == [6, 2]  # asked 16 of 8: halved
    assert normalise(np.array([1, 3]), 8, shares).tolist() == [4, 4]  # 4 spare, split 3:1
    assert normalise(np.array([0, 0]), 8, shares).tolist() == [6, 2]


def test_a_vc_is_planned_for_what_it_asks_now_when_the_forecast_is_lower() -> None:
    targets, now, most = np.array([4, 0, 2]), np.array([1, 9, 3]), np.array([8, 6, 8])
    assert wants(targets, now, most).tolist() == [4, 6, 3]  # never below the target; at most max_gpus


def per_vc_forecaster(levels: list[float]) -> SimpleNamespace:
    """Forecasts ``levels[v]`` for VC ``v``, at every lead and quantile."""

    def predict(batch: ForecastInput) -> Forecast:
        point = np.repeat(np.array(levels, dtype=float)[:, None], len(batch.leads), axis=1)
        return Forecast(point=point, quantiles=np.stack([point] * len(QUANTILES), axis=-1), leads=batch.leads)

    return SimpleNamespace(name="per-vc", predict=predict)


def forecast_policy(shares: list[int], levels: list[float], max_gpus: list[int]) -> ForecastShares:
    inner = ForecastQuota(np.array(max_gpus), ScalerSettings(margin=0.0, tolerance=0.0, scale_up_gpus=100),
                          per_vc_forecaster(levels), history_step=600, lead_steps=1, quantile=0.9, context_steps=10)
    return ForecastShares(np.array(shares), inner)


def test_forecast_moves_quota_to_where_demand_is_coming() -> None:
    # b expects 6 GPUs, a none but holds 1: b gets its 6, a the 1 it asks now, and the spare 1 goes 1:1
    jobs = JobTable.from_lists([("a", 0, 5000, 1), ("b", 1000, 100, 6)])
    r = simulate_fixed(jobs, forecast_policy([4, 4], [0.0, 6.0], [8, 8]), config(8, lend_delay=1e9))
    # first decision: a's recommender holds 4 (the scaler's 300-s scale-down window), b asks 6: 10 of 8,
    # scaled down to 3 and 5; then a's target is 0 but it asks 1 now (its running job), b's 6, and the
    # spare GPU goes as the static shares (1:1, the first VC on a tie)
    assert r.quota_at_decision[:, :3].T.tolist() == [[3, 5], [2, 6], [2, 6]]
    assert r.quota_at_decision.sum(axis=0).tolist() == [8] * r.quota_at_decision.shape[1]
    assert r.gpus_moved == 2 and r.quota_changes.tolist() == [2, 2]
    assert r.first_start.tolist() == [0, 1000]  # a runs in its new quota, b's job within its own
    static = simulate_fixed(jobs, StaticShares(np.array([4, 4])), config(8))
    assert static.excluded.tolist() == [0, OVER_VC]


class Scripted(Lending):
    """Quotas set on a schedule ``[(from time, quotas)]``, lending as ``reactive``."""

    name = "scripted"

    def __init__(self, shares: list[int], schedule: list[tuple[float, list[int]]]) -> None:
        super().__init__(np.array(shares))
        self.schedule = schedule

    def decide(self, view) -> np.ndarray:
        return np.array([q for t, q in self.schedule if view.now >= t][-1])


def test_a_quota_moved_away_is_reclaimed_by_waiting_or_by_preemption() -> None:
    # a runs 3 jobs in its quota of 3; from 600 its quota is 1 and b's 7: b's 6-GPU job needs one of a's
    jobs = JobTable.from_lists([*[("a", 0, 5000, 1)] * 4, ("b", 1, 100, 6)])
    schedule = [(0, [3, 5]), (600, [1, 7])]
    wait = simulate_fixed(jobs, Scripted([4, 4], schedule), config(8, lend_delay=1e9))
    assert wait.first_start.tolist() == [0, 0, 0, 5000, 5000]  # a's 4th job then fits its quota of 1
    assert wait.lent_gpu_seconds == 2 * (5000 - 600)
    preempt = simulate_fixed(jobs, Scripted([4, 4], schedule), config(8, lend_delay=1e9, preempt=True))
    assert preempt.first_start[4] == 600 and preempt.reclaim_preemptions == 1
    assert preempt.preemptions.tolist() == [0, 0, 1, 0, 0]  # the newest of a's jobs, one is enough


def test_reductions_are_taken_over_the_jobs_both_policies_ran() -> None:
    jobs = JobTable.from_lists([("a", 0, 10, 3), *[("b", 0, 100, 1)] * 4])
    static = simulate_fixed(jobs, StaticShares(np.array([2, 2])), config(4))
    lending = simulate_fixed(jobs, Lending(np.array([2, 2])), config(4, lend_delay=0.0))
    cut = reduction(lending, static)
    assert cut["jobs"] == 4  # the 3-GPU job ran only with lending
    assert static.queued_seconds[1:].tolist() == [0, 0, 100, 100]
    assert cut["mean"] == pytest.approx(1 - lending.queued_seconds[1:].mean() / 50)
    rows = [{"scheduling": s, "forecast_vs_static": {"mean": a}, "forecast_vs_reactive": {"mean": b}}
            for s, a, b in (("fifo", 0.6, 0.0), ("sjf", 0.4, 0.1))]
    t = targets(rows)
    assert t["forecast_halves_static_wait"] == {"met": False, "worst_scheduling": "sjf", "worst_cut": 0.4}
    assert not t["forecast_beats_reactive"]["met"]  # a tie is not a win


# --- the CLI ---------------------------------------------------------------------------------------------

def write_philly(directory: Path, rows: list[tuple[str, float, int, str]]) -> Path:
    """A philly.csv.gz of ``(timestamp, duration, gpus, vc)`` rows."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    lines += [f"{t},{d},{g},{d * g},{vc}" for t, d, g, vc in rows]
    with gzip.open(directory / "philly.csv.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    return directory


def small_log(tmp_path: Path) -> Path:
    rows = []
    for day in range(4):
        for hour in range(0, 24, 2):
            rows.append((f"2017-10-{day + 1:02d} {hour:02d}:00:00", 3000.0, 1 + hour % 4, "vca"))
            rows.append((f"2017-10-{day + 1:02d} {hour:02d}:30:00", 900.0, 2, "vcb" if day < 2 else "vca"))
    rows.append(("2017-10-02 05:00:00", 60.0, 64, "vcb"))  # more than the cluster
    return write_philly(tmp_path / "log", rows)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``dprobe simulate fixed --quiet ARGV``: the exit code, stdout and stderr."""
    code = main(["simulate", "fixed", "--quiet", *argv])
    return (code, *capsys.readouterr())


@pytest.mark.slow
def test_cli_fixed_json_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plot = tmp_path / "fixed.png"
    code, out, _ = run_cli(capsys, "--data", str(small_log(tmp_path)), "--gpus", "16",
                           "--json", "--per-vc", "--plot", str(plot))
    assert code == 0
    report = json.loads(out)
    s = report["settings"]
    assert (report["mode"], s["gpus"], s["nodes"], s["gpus_from"]) == ("fixed", 16, 2, "--gpus")
    assert sum(s["static_gpus"].values()) == 16
    assert [(r["scheduling"], r["quota"]) for r in report["runs"]] == [
        (sch, q) for sch in ("fifo", "sjf", "qssf", "tiresias", "easy")
        for q in ("static", "reactive", "forecast")]
    for r in report["runs"]:
        assert r["jobs"] == report["jobs"] == sum(v["jobs"] for v in r["vcs"])
        assert r["excluded_over_cluster"] == 1  # the 64-GPU job, counted under every policy
        assert 0 <= r["p50_wait_seconds"] <= r["p95_wait_seconds"] <= r["p99_wait_seconds"]
        assert 0 < r["gpu_utilization"] <= 1 and r["mean_jct_seconds"] >= 900
        assert r["gpus_moved"] == 0 or r["quota"] == "forecast"
        assert r["preemptions"] == r["reclaim_preemptions"] + r["las_preemptions"] == sum(
            v["preemptions"] for v in r["vcs"])
    assert [row["scheduling"] for row in report["reductions"]] == s["scheduling"]
    assert set(report["targets"]) == {"forecast_halves_static_wait", "forecast_beats_reactive"}
    assert plot.stat().st_size > 10_000


def test_cli_fixed_table_at_the_default_size(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    code, out, _ = run_cli(capsys, "--data", str(small_log(tmp_path)), "--scheduling", "fifo,easy",
                           "--policies", "static,reactive", "--preempt")
    assert code == 0
    assert "GPUs fixed" in out and "| easy | reactive |" in out and "reactive vs static" in out
    assert "forecast" not in out.split("Cut in mean")[0]
    assert "reclaimed by preempting lent jobs" in out


def test_cli_help_explains_the_fixed_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "fixed", "--help"])
    out = capsys.readouterr().out
    for flag in ("--gpus N", "--gpus-per-node", "--scheduling", "--lend-delay", "--preempt",
                 "--restart-cost", "--las-thresholds", "--starve-limit", "tiresias", "easy", "qssf", "no user column"):
        assert flag in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--gpus", "60"], "--gpus must be a positive multiple of --gpus-per-node (8), got 60"),
    (["--scheduling", "fifo,lottery"], "unknown scheduling policy lottery"),
    (["--las-thresholds", "1h"], "--las-thresholds must be comma-separated GPU-seconds"),
    (["--lend-delay", "-1", "--gpus", "8"], "--lend-delay must be >= 0 seconds"),
    (["--starve-limit", "nan"], "--starve-limit must be a number >= 0"),
    (["--gpus", "64", "--gpus-percentile", "90"], "give --gpus or --gpus-percentile, not both"),
    (["--gpus-percentile", "0"], "--gpus-percentile must be in (0, 100], got 0"),
])
def test_cli_fixed_bad_options_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                    message: str) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("dprobe simulate: error:") and message in err and err.count("\n") == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["simulate", "--gpus", "64"], "--gpus is an option of `dprobe simulate fixed`, not of `dprobe simulate quota`"),
    (["simulate", "quota", "--preempt"], "--preempt is an option of `dprobe simulate fixed`"),
    (["simulate", "--gpus-percentile=95"], "--gpus-percentile is an option of `dprobe simulate fixed`"),
    (["simulate", "fixed", "--queue", "fifo"], "--queue is an option of `dprobe simulate quota`, not of `dprobe "
                                               "simulate fixed`"),
    (["simulate", "--fixed", "--static-gpus", "8"], "--static-gpus is an option of `dprobe simulate quota`"),
    (["simulate", "fixed", "--gpu-memory", "80"], "--gpu-memory is an option of `dprobe simulate sharing`"),
    (["simulate", "quota", "--fixed"], "--fixed is the old spelling of `dprobe simulate fixed`"),
])
def test_an_option_of_another_simulator_is_refused_naming_its_sub_command(capsys: pytest.CaptureFixture[str],
                                                                           argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == "" and message in err


@pytest.mark.parametrize(("row", "message"), [
    (("2017-10-01 00:00:00", -5.0, 1, "vca"), "duration"),
    (("2017-10-01 00:00:00", 10.0, 0, "vca"), "num_gpus"),
])
def test_cli_fixed_refuses_an_impossible_job(capsys: pytest.CaptureFixture[str], tmp_path: Path, row,
                                             message: str) -> None:
    log = write_philly(tmp_path / "bad", [("2017-10-01 00:00:00", 10.0, 1, "vca"), row])
    code, _, err = run_cli(capsys, "--data", str(log))
    assert code == 2 and "philly.csv.gz" in err and message in err


def test_cli_fixed_refuses_a_log_without_a_column(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "cols"
    log.mkdir()
    with gzip.open(log / "philly.csv.gz", "wt") as f:
        f.write("timestamp,duration,cluster\n2017-10-01 00:00:00,10,vca\n")
    code, _, err = run_cli(capsys, "--data", str(log))
    assert code == 2 and "num_gpus" in err


# --- the default size, and a job log derived from per-minute counts ---------------------------------------

def test_default_size_is_a_percentile_of_the_concurrent_demand_in_whole_nodes() -> None:
    # 1 GPU held over [0, 600), 9 over [600, 1200) (two jobs overlap), 8 over [1200, 2400)
    jobs = JobTable.from_lists([("a", 0, 1200, 1), ("b", 600, 1800, 8), ("a", 2400, 600, 2)])
    assert concurrent_demand(jobs, 600.0).tolist() == [1, 9, 8, 8, 2]
    assert default_gpus(jobs, 50, 600.0, 4) == 8  # p50 = 8
    assert default_gpus(jobs, 90, 600.0, 4) == 12  # p90 = 8.4, up to whole nodes of 4
    assert default_gpus(jobs, 100, 600.0, 8) == 16  # the peak, 9


def test_jobs_are_derived_from_net_changes_in_the_per_minute_counts() -> None:
    t = np.arange(6) * 60.0
    jobs = np.array([1, 3, 3, 2, 0, 1])
    gpus = np.array([2, 6, 6, 4, 0, 3])
    stats = DeriveStats()
    out = derive_class(t, jobs, gpus, 1, 7, stats)
    # one job of 2 GPUs present from the start; two of 2 each (4 GPUs more) at 60; the oldest leaves at 180,
    # the other two at 240; one of 3 arrives at 300 and is still there after the last minute
    assert out == [(0.0, 180.0, 2), (60.0, 180.0, 2), (60.0, 180.0, 2), (300.0, 60.0, 3)]
    assert (stats.present_at_start, stats.present_at_end, stats.gpu_mismatch) == (1, 1, 0.0)
    big = derive_class(t[:2], np.array([0, 1]), np.array([0, 4]), 8, None, DeriveStats())
    assert big == [(60.0, 60.0, 8)]  # kept within its class: at least 8 GPUs


def test_a_helios_directory_is_simulated_as_a_derived_log(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    from dprobe.sim.helios_jobs import COLUMNS

    directory = tmp_path / "helios"
    directory.mkdir()
    for vc, scale in (("vcaaa", 1), ("vcbbb", 2)):
        rows = [",".join(COLUMNS)]
        for minute in range(240):
            n = scale * (1 + (minute // 30) % 3)
            time = f"2020-05-01 {minute // 60:02d}:{minute % 60:02d}:00"
            rows.append(",".join([time, str(n), str(2 * n), "0", "0", "0", "0", "0", "0"]))
        with gzip.open(directory / f"{vc}.csv.gz", "wt") as f:
            f.write("\n".join(rows) + "\n")
    frame, stats = derive_jobs(directory)
    assert stats.per_vc == {"vcaaa": len(frame[frame.cluster == "vcaaa"]), "vcbbb": len(frame) - stats.per_vc["vcaaa"]}
    assert stats.gpu_mismatch == 0 and set(frame.num_gpus) == {2}
    code, out, _ = run_cli(capsys, "--data", str(directory), "--scheduling", "fifo", "--json")
    report = json.loads(out)
    assert code == 0 and report["dataset"] == "helios-earth-vc (derived jobs)" and report["jobs"] == len(frame)
    bad = tmp_path / "bad"
    bad.mkdir()
    with gzip.open(bad / "vcccc.csv.gz", "wt") as f:
        f.write("time,running_job_num\n2020-05-01 00:00:00,1\n")
    with pytest.raises(Exception, match="vcccc.csv.gz: missing column running_job_num_less_8"):
        derive_jobs(bad)
