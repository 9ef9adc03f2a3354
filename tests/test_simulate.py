"""``dprobe simulate``: the event simulation on hand-built job lists, the policies, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dprobe.cli import main
from dprobe.forecaster.base import QUANTILES, Forecast, ForecastInput
from dprobe.scaling.policy import Policy, Recommender
from dprobe.sim.jobs import JobTable, peak_demand
from dprobe.sim.policies import (
    ForecastQuota,
    QuotaPolicy,
    ReactiveQuota,
    ScalerSettings,
    StaticQuota,
    static_quotas,
)
from dprobe.sim.quota.cluster import SimConfig, simulate
from dprobe.sim.view import ClusterView

DATASETS = Path(__file__).resolve().parents[1] / "datasets"
FIFO = SimConfig(interval=600, provision_delay=300, backfill=False)
BACKFILL = SimConfig(interval=600, provision_delay=300, backfill=True)


class Scripted(QuotaPolicy):
    """Quota per VC from a function of the decision time (one VC here)."""

    name = "scripted"

    def __init__(self, initial: int, quota_at, max_gpus: int = 100) -> None:
        self.initial, self.quota_at = initial, quota_at
        self.max_gpus = np.array([max_gpus])

    def initial_quota(self) -> np.ndarray:
        return np.array([self.initial])

    def decide(self, view: ClusterView) -> np.ndarray:
        return np.array([self.quota_at(view.now)])


def one_vc(*jobs: tuple[float, float, int]) -> JobTable:
    """Jobs ``(submit, duration, gpus)`` of a single VC "a"."""
    return JobTable.from_lists([("a", s, d, g) for s, d, g in jobs])


def test_second_job_waits_for_the_first_on_one_gpu() -> None:
    r = simulate(one_vc((0, 100, 1), (0, 50, 1)), StaticQuota(np.array([1])), FIFO)
    assert r.start.tolist() == [0, 100]
    assert r.waits().tolist() == [0, 100]
    assert r.end_time == 150
    assert r.used_gpu_seconds[0] == 150 and r.provisioned_gpu_seconds[0] == 150


def test_quota_increase_arrives_after_the_provisioning_delay() -> None:
    r = simulate(one_vc((0, 100, 2)), Scripted(0, lambda t: 2), FIFO)
    assert r.start[0] == 300  # ordered at t=0, in service at 300
    assert r.scale_events[0] == 1
    # GPUs still coming up are provisioned: 2 GPUs from 0 to the end (400)
    assert r.provisioned_gpu_seconds[0] == 800 and r.used_gpu_seconds[0] == 200
    r0 = simulate(one_vc((0, 100, 2)), Scripted(0, lambda t: 2), SimConfig(provision_delay=0))
    assert r0.start[0] == 0


def test_quota_decrease_never_preempts() -> None:
    jobs = one_vc((0, 1000, 4), (700, 100, 1))
    r = simulate(jobs, Scripted(4, lambda t: 4 if t < 600 else 1), FIFO)
    assert r.start.tolist() == [0, 1000]  # the 1-GPU job waits until the 4-GPU one ends
    assert r.used_gpu_seconds[0] == 4 * 1000 + 100
    # 4 GPUs held until 1000 although the quota is 1 from 600; then the quota of 1
    assert r.provisioned_gpu_seconds[0] == 4 * 1000 + 1 * 100


def test_oversized_job_is_rejected_and_does_not_block() -> None:
    r = simulate(one_vc((0, 100, 4), (1, 10, 1)), StaticQuota(np.array([2])), FIFO)
    assert r.rejected.tolist() == [True, False]
    assert r.start[1] == 1
    assert np.isnan(r.waits()[0]) and r.waits()[1] == 0


@pytest.mark.parametrize(("config", "wait_small"), [(FIFO, 98), (BACKFILL, 0)])
def test_backfill_lets_a_small_job_pass_a_blocked_head(config: SimConfig, wait_small: float) -> None:
    jobs = one_vc((0, 100, 3), (1, 100, 2), (2, 10, 1))
    r = simulate(jobs, StaticQuota(np.array([4])), config)
    assert r.start[1] == 100
    assert r.waits()[2] == wait_small


def test_queued_job_that_never_fits_is_reported_not_waited_on_for_ever() -> None:
    r = simulate(one_vc((0, 100, 3)), Scripted(2, lambda t: 2, max_gpus=4), SimConfig(stall_seconds=3600))
    assert r.unstarted.tolist() == [True] and not r.rejected[0]
    assert r.waits()[0] == r.end_time > 3600


def test_static_quota_is_a_warmup_percentile_at_least_the_largest_job() -> None:
    # demand of "a": 1 GPU for the first 10 minutes, 0 after; "b": one 8-GPU job of 60 s
    jobs = JobTable.from_lists([("a", 0, 600, 1), ("b", 0, 60, 8), ("a", 36000, 60, 1)])
    quota = static_quotas(jobs, percentile=50, warmup_fraction=0.5, step_seconds=600)
    assert quota.tolist() == [1, 8]  # p50 is 0 for both, raised to the largest job
    assert peak_demand(jobs).tolist() == [1, 8]


def test_reactive_goes_through_the_scalers_policy() -> None:
    jobs = one_vc(*[(0, 3600, 1)] * 20)
    policy = ReactiveQuota(np.array([10]), ScalerSettings(margin=0.0, tolerance=0.0))
    assert isinstance(policy.policies[0], Policy) and isinstance(policy.recommenders[0], Recommender)
    assert policy.policies[0].target == 1.0 and policy.policies[0].max_replicas == 10
    r = simulate(jobs, policy, FIFO)
    quotas = r.quota_at_decision[0]
    assert quotas.max() == 10  # max_replicas bounds the quota, 20 GPUs asked
    assert quotas[0] == 0  # the jobs arrive just after the first decision
    assert quotas[1:4].tolist() == [4, 8, 10]  # the scaler's scale-up rate limit: +4 pods or +100 %
    assert r.rejected.sum() == 0 and not r.unstarted.any()
    assert np.all(r.used_gpu_seconds <= r.provisioned_gpu_seconds)


def test_scale_up_tolerance_zero_serves_a_demand_just_above_the_quota() -> None:
    # 20 one-GPU jobs, then a 21st: 5 % above a quota of 20, inside the default tolerance of 10 %
    jobs = one_vc(*[(0, 20000, 1)] * 20, (4000, 3600, 1))  # the quota reaches 20 at 2400 s
    held = simulate(jobs, ReactiveQuota(np.array([40]), ScalerSettings(margin=0.0)), FIFO)
    eager = simulate(jobs, ReactiveQuota(np.array([40]), ScalerSettings(margin=0.0, scale_up_tolerance=0.0)), FIFO)
    assert held.quota_at_decision[0].max() == 20 and held.waits()[-1] > 10000  # until the others end
    assert eager.quota_at_decision[0].max() == 21 and eager.waits()[-1] < 1200  # next decision + delay


def test_scale_up_gpus_sets_the_scale_up_rate_limit() -> None:
    jobs = one_vc(*[(0, 3600, 1)] * 20)
    r = simulate(jobs, ReactiveQuota(np.array([40]), ScalerSettings(margin=0.0, tolerance=0.0, scale_up_gpus=16)),
                 FIFO)
    assert r.quota_at_decision[0][1:3].tolist() == [16, 20]  # +16 (more than doubling 0), then the demand


def test_reactive_rejects_jobs_above_max_gpus() -> None:
    r = simulate(one_vc((0, 10, 16), (0, 10, 1)), ReactiveQuota(np.array([8]), ScalerSettings()), FIFO)
    assert r.rejected.tolist() == [True, False]


class ConstantForecaster:
    """Every quantile is ``level`` at every lead; remembers the batches it was given."""

    name = "constant"

    def __init__(self, level: float) -> None:
        self.level, self.batches = level, []

    def predict(self, batch: ForecastInput) -> Forecast:
        self.batches.append(batch)
        shape = (len(batch.values), len(batch.leads))
        return Forecast(point=np.full(shape, self.level), quantiles=np.full((*shape, len(QUANTILES)), self.level),
                        leads=batch.leads)


def test_forecast_feeds_the_forecast_to_the_scaler_for_all_vcs_at_once() -> None:
    jobs = JobTable.from_lists([("a", 0, 7200, 1), ("b", 0, 7200, 2)])
    model = ConstantForecaster(7.0)
    policy = ForecastQuota(np.array([100, 5]), ScalerSettings(margin=0.1, tolerance=0.0), model,
                           history_step=600, lead_steps=2, quantile=0.9, context_steps=50)
    r = simulate(jobs, policy, FIFO)
    # after the rate-limited first step (4), ceil(7 * 1.1) = 8 for "a"; "b" held at max_replicas 5
    assert r.quota_at_decision[0, :3].tolist() == [4, 8, 8]
    assert r.quota_at_decision[1].max() == 5
    assert all(b.values.shape[0] == 2 and b.leads == (2,) and b.metric == "gpu_demand" for b in model.batches)
    assert model.batches[-1].values[:, -1].tolist() == [1, 2]  # the demand now, last in the window


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["simulate", "quota", "--quiet", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_cli_json_on_two_days_of_philly(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plot = tmp_path / "sim.png"
    code, out, _ = run_cli(capsys, "--start-day", "30", "--days", "2", "--json", "--per-vc", "--plot", str(plot))
    assert code == 0
    report = json.loads(out)
    assert report["dataset"] == "philly-jobs" and report["jobs"] > 1000 and report["log_days"] <= 2
    assert [p["policy"] for p in report["policies"]] == ["static", "reactive", "forecast"]
    for p in report["policies"]:
        assert {"mean_wait_seconds", "p50_wait_seconds", "p95_wait_seconds", "p99_wait_seconds",
                "waited_over_10min_share", "gpu_hours_provisioned", "gpu_hours_used",
                "utilization_of_provisioned", "scale_events", "rejected_jobs"} <= set(p)
        assert p["jobs"] == report["jobs"] == sum(v["jobs"] for v in p["vcs"])
        assert p["rejected_jobs"] + p["unstarted_jobs"] < p["jobs"]
        assert 0 < p["gpu_hours_used"] <= p["gpu_hours_provisioned"] + 1e-6
        assert 0 < p["utilization_of_provisioned"] <= 1
        assert 0 <= p["p50_wait_seconds"] <= p["p95_wait_seconds"] <= p["p99_wait_seconds"]
        assert 0 <= p["waited_over_10min_share"] <= 1
    static, reactive, forecast = report["policies"]
    assert static["scale_events"] == 0 and reactive["scale_events"] > 0
    assert reactive["rejected_jobs"] == 0  # default max_gpus: the VC's unconstrained peak
    assert plot.stat().st_size > 10_000


@pytest.mark.slow
def test_scaler_config_is_simulated_as_the_flags_that_say_the_same(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    config = tmp_path / "scaler.yaml"
    config.write_text("scaler:\n  target: 0.7\n  max_gpus: 64\n"
                      "  scale_up: {tolerance: 0, policies: [{type: percent, value: 100}, {type: pods, value: 16}]}\n")
    days = ["--start-day", "30", "--days", "2", "--json", "--policies", "reactive,forecast"]
    code, out, _ = run_cli(capsys, *days, "--scaler-config", str(config), "--max-gpus", "64")
    assert code == 0
    from_file = json.loads(out)
    policy = from_file["settings"]["policy"]
    assert (policy["target"], policy["scale_up"]["tolerance"], policy["scale_up"]["policies"][1]["value"]) == (
        1.0, 0.0, 16.0)  # the file's rules, demand in GPUs
    code, out, _ = run_cli(capsys, *days, "--scale-up-tolerance", "0", "--scale-up-gpus", "16", "--max-gpus", "64")
    from_flags = json.loads(out)
    assert [p["mean_wait_seconds"] for p in from_file["policies"]] == [
        p["mean_wait_seconds"] for p in from_flags["policies"]]
    assert [p["scale_events"] for p in from_file["policies"]] == [p["scale_events"] for p in from_flags["policies"]]
    code, _, err = run_cli(capsys, "--scaler-config", str(config), "--margin", "0.2", "--tolerance", "0")
    assert code == 2 and "set --margin, --tolerance in that file instead" in err


@pytest.mark.slow
def test_the_shipped_forecaster_drives_the_forecast_policy(capsys: pytest.CaptureFixture[str]) -> None:
    from dprobe.forecaster.loading import SHIPPED_FORECASTER, checkpoint_path

    assert (checkpoint_path("dprobe"), checkpoint_path(None), checkpoint_path("x.pt")) == (SHIPPED_FORECASTER, None,
                                                                                          "x.pt")
    days = ["--start-day", "30", "--days", "1", "--json", "--policies", "forecast"]
    code, out, _ = run_cli(capsys, *days, "--checkpoint", "dprobe")
    assert code == 0
    shipped = json.loads(out)
    assert "dprobe-forecaster (onnx)" in shipped["forecaster"]
    code, out, _ = run_cli(capsys, *days)
    baseline = json.loads(out)
    assert baseline["forecaster"].startswith("baseline:last_value")
    assert shipped["policies"][0]["jobs"] == baseline["policies"][0]["jobs"]


def test_cli_table_for_one_itp_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--data", str(DATASETS / "itp-elasticflow"), "--vc", "cluster10",
                           "--policies", "static,reactive", "--static-gpus", "8")
    assert code == 0
    assert "itp-elasticflow" in out and "| reactive |" in out and "| forecast |" not in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--vc", "no-such-vc", "--days", "1"], "unknown virtual cluster(s) no-such-vc"),
    (["--data", "/no/such/dir"], "/no/such/dir: not a directory"),
    (["--interval", "-5", "--days", "1"], "--interval must be a positive number of seconds"),
    (["--policies", "static,oracle"], "unknown policy oracle"),
    (["--quantile", "0.8", "--days", "1"], "--quantile must be one of"),
    (["--scale-up-tolerance", "-1", "--days", "1"], "--scale-up-tolerance must be >= 0, got -1"),
    (["--scale-up-gpus", "0", "--days", "1"], "--scale-up-gpus must be >= 1"),
    (["--data", str(DATASETS / "helios-earth-vc")], "not a job log"),
])
def test_cli_bad_input_exits_2_with_a_message(capsys: pytest.CaptureFixture[str], argv: list[str],
                                             message: str) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("dprobe simulate: error:") and message in err


def test_select_slices_by_day_and_drops_vcs_left_without_jobs() -> None:
    day = 86400.0
    jobs = JobTable.from_lists([("a", 0, 1, 1), ("b", 1.5 * day, 1, 1), ("a", 2.5 * day, 1, 1), ("c", 9 * day, 1, 1)])
    part = jobs.select(days=2, start_day=1)
    assert part.vc_names == ["a", "b"] and part.submit.tolist() == [1.5 * day, 2.5 * day]
    assert part.vc.tolist() == [1, 0]
    assert jobs.select(vcs=["c"]).job_ids.tolist() == ["job-3"]


def test_default_horizon_is_the_delay_rounded_up_to_intervals(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--start-day", "30", "--days", "0.2", "--json", "--policies", "forecast",
                           "--provision-delay", "700")
    assert code == 0
    assert json.loads(out)["settings"]["horizon_seconds"] == 1200
