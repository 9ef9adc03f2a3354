"""h200-profiles' training runs as a job-scale task of the forecaster: series per run, split by model family,
scored leave-family-out beside persistence, the unknown-workload embedding and the job-scale model."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dprobe.core.split import Split
from dprobe.data import load_series_dataset
from dprobe.data.common import family_of
from dprobe.data.h200 import JOB_FIRST_ORIGIN, JOB_LEAD_STEPS, load_h200_profiles
from dprobe.data.workloads import read_workloads
from dprobe.evaluation.jobs import (
    JOBSCALE,
    evaluate_jobs,
    first_second_rows,
    held_out_runs,
    persistence_offsets,
    read_jobscale_predictions,
)
from dprobe.forecaster.tasks import TaskSpec

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "datasets" / "h200-profiles"


@pytest.fixture(scope="module")
def jobs():
    return load_series_dataset(H200)


@pytest.fixture(scope="module")
def graph_cache(tmp_path_factory) -> str:
    """Model graphs traced once for the module's data modules."""
    return str(tmp_path_factory.mktemp("graphs"))


def test_each_training_run_is_a_series_of_its_nvml_samples(jobs) -> None:
    profiles = load_h200_profiles(H200)
    runs = profiles.train_runs()
    assert jobs.groups is not None and set(jobs.series_ids) <= set(runs["run_id"])
    assert len(jobs.series_ids) >= 0.95 * len(runs)
    assert jobs.freq.total_seconds() == pytest.approx(0.1) and jobs.lead_steps == JOB_LEAD_STEPS
    assert jobs.first_origin == JOB_FIRST_ORIGIN
    rid = jobs.series_ids[5]
    samples = profiles.run_samples(rid)
    mem = jobs.arrays("gpu_memory_bytes")[rid]
    util = jobs.arrays("gpu_duty_cycle_pct")[rid]
    # the same samples, on the 0.1 s grid from the run's first one
    assert np.nanmax(mem) == samples["mem_used_bytes"].max() and mem[0] == samples["mem_used_bytes"].iloc[0]
    assert np.nanmean(util) == pytest.approx(samples["gpu_util_pct"].mean(), rel=0.05)
    model = runs.set_index("run_id").loc[rid, "model"]
    assert jobs.groups[rid] == family_of(str(model))


def test_runs_csv_names_every_runs_model_as_workloads_csv_would() -> None:
    table = read_workloads(H200)
    runs = load_h200_profiles(H200).train_runs().set_index("run_id")
    assert table is not None and list(table.columns[:3]) == ["series", "model", "batch"]
    row = table.set_index("series").loc["r001"]
    assert row["model"].startswith("transformers:") and row["batch"] == runs.loc["r001", "batch"]
    assert table.set_index("series").loc["r000", "model"] == f"torchvision:{runs.loc['r000', 'model']}"


def test_families_fall_into_parts_by_name_in_the_splits_shares() -> None:
    split = Split()
    names = [f"family{i}" for i in range(3000)]
    roles = [split.group_role(n) for n in names]
    assert roles == [Split().group_role(n) for n in names]  # stable
    share = {r: roles.count(r) / len(roles) for r in ("train", "validation", "test")}
    assert share["train"] == pytest.approx(0.6, abs=0.03) and share["validation"] == pytest.approx(0.1, abs=0.02)
    assert Split(0.0, 0.0).group_role("anything") == "test" and Split(1.0, 1.0).group_role("x") == "train"


@pytest.mark.slow
def test_the_datamodule_trains_on_training_families_and_never_sees_test_families(small_jobs_dir, graph_cache) -> None:
    from dprobe.forecaster.windows import SeriesDataModule

    jobs = load_series_dataset(small_jobs_dir)
    dm = SeriesDataModule([str(small_jobs_dir)], context_length=32, samples_per_epoch=256, val_samples=64,
                          workload_cache=graph_cache, workload_dropout=0.5)
    dm.setup()
    assert [t.spec.dataset for t in dm.tasks] == ["h200-profiles", "h200-profiles"]
    ids = sorted(jobs.series_ids)
    role = {u: dm.split.group_role(jobs.groups[u]) for u in ids}
    trained = {ids[i] for i in dm._train_rows[:, 1]}
    validated = {ids[i] for i in dm.calibration_rows[:, 1]}
    assert trained and validated and {role[u] for u in trained} == {"train"}
    assert {role[u] for u in validated} == {"validation"}
    assert all(t >= JOB_FIRST_ORIGIN for t in dm._train_rows[:, 2])
    assert dm.tasks[0].known.all()  # runs.csv names every run's model
    # workload dropout hides some known workloads in training windows only
    batch = next(iter(dm.train_dataloader()))
    assert 0 < batch.known.float().mean() < 1
    assert next(iter(dm.val_dataloader())).known.all()


def test_job_tasks_share_the_training_draws_they_are_given(small_helios_dir, small_jobs_dir, graph_cache) -> None:
    from dprobe.forecaster.windows import SeriesDataModule

    dm = SeriesDataModule([str(small_helios_dir), str(small_jobs_dir)], context_length=32, samples_per_epoch=4000,
                          val_samples=64, workload_cache=graph_cache, job_share=0.25)
    dm.setup()
    sampler = dm.train_dataloader().sampler
    drawn = dm._train_rows[np.asarray(list(iter(sampler)))][:, 0]
    jobs = np.asarray(dm.job_tasks)[drawn]
    assert jobs.mean() == pytest.approx(0.25, abs=0.03)
    with pytest.raises(ValueError, match="job_share"):
        SeriesDataModule([str(H200)], job_share=1.0)
    with pytest.raises(ValueError, match="workload_dropout"):
        SeriesDataModule([str(H200)], workload_dropout=1.0)


def test_a_job_data_set_without_a_validation_family_is_refused_by_name(small_h200_dir, graph_cache) -> None:
    from dprobe.forecaster.windows import SeriesDataModule

    families = {family_of(m) for m in pd.read_csv(small_h200_dir / "runs.csv")["model"]}
    assert not any(Split().group_role(f) == "validation" for f in families)
    dm = SeriesDataModule([str(small_h200_dir)], context_length=32, workload_cache=graph_cache)
    with pytest.raises(ValueError, match="validation share"):
        dm.setup()


class _Drift:
    """A forecaster that adds a fixed amount to the last value, quantiles spread above it."""

    name, context_length, conditioned = "drift", 16, False

    def __init__(self, step: float) -> None:
        self.step = step
        self.tasks = [TaskSpec("gpu_memory_bytes", "h200-profiles", JOB_LEAD_STEPS, 0.1, (), 1.0)]

    def predict(self, batch):
        from dprobe.forecaster.base import Forecast

        last = pd.DataFrame(batch.values.T).ffill().to_numpy().T[:, -1]
        point = np.repeat((last + self.step)[:, None], len(batch.leads), 1)
        q = np.stack([point, point * 1.05, point * 1.2], -1)
        return Forecast(point=point, quantiles=q, leads=batch.leads, quantile_levels=(0.5, 0.9, 0.99))


def test_jobs_are_scored_on_test_families_only_from_their_first_second(jobs) -> None:
    split = Split()
    result = evaluate_jobs(jobs, {"drift": _Drift(0.0)}, split)
    runs = set(held_out_runs(jobs, split))
    assert runs and all(split.group_role(jobs.groups[u]) == "test" for u in runs)
    for method in ("last_value", "drift"):
        per = result.forecasts[method]["gpu_memory_bytes"]
        assert set(per) <= runs and min(f.origins[0] for f in per.values()) == JOB_FIRST_ORIGIN
    rows = {(r["method"], r["target"], r["lead_steps"]): r for r in result.rows}
    # the drift forecaster with no drift is persistence: the same MAE
    for h in JOB_LEAD_STEPS:
        a, b = rows[("last_value", "gpu_memory_bytes", h)], rows[("drift", "gpu_memory_bytes", h)]
        assert a["mae"] == pytest.approx(b["mae"]) and a["n_forecasts"] == b["n_forecasts"]
    assert rows[("last_value", "gpu_memory_bytes", 10)]["n_forecasts"] > rows[("last_value", "gpu_memory_bytes",
                                                                                100)]["n_forecasts"]
    # persistence's quantiles: the training families' changes over the lead, as measured
    offsets = persistence_offsets(jobs, "gpu_memory_bytes", split)
    changes = [y[t + 10] - y[t] for u, y in jobs.arrays("gpu_memory_bytes").items()
               if split.group_role(jobs.groups[u]) == "train" for t in range(JOB_FIRST_ORIGIN, len(y) - 10)]
    changes = np.asarray(changes)
    assert offsets[0] == pytest.approx(np.quantile(changes[np.isfinite(changes)], (0.5, 0.9, 0.99)))
    assert (np.diff(offsets, axis=1) >= 0).all()


def test_the_job_scale_models_predictions_are_scored_from_the_first_second(jobs, tmp_path) -> None:
    split = Split()
    result = evaluate_jobs(jobs, {"drift": _Drift(0.0)}, split)
    runs = held_out_runs(jobs, split)
    mem = jobs.arrays("gpu_memory_bytes")
    rows = []
    for u in runs:
        later = mem[u][JOB_FIRST_ORIGIN + 1: JOB_FIRST_ORIGIN + 101]
        plateau = float(np.quantile(later[np.isfinite(later)], 0.9))
        for target, p in (("memory_plateau_bytes", plateau), ("gpu_utilization", 0.5)):
            rows.append({"run_id": u, "family": jobs.groups[u], "variant": "graph", "target": target,
                         "p50": p, "p90": p * 1.1, "p99": p * 1.2})
    pd.DataFrame(rows).to_csv(tmp_path / "lofo.csv", index=False)
    predictions = read_jobscale_predictions(str(tmp_path / "lofo.csv"))
    first = first_second_rows(result, jobs, predictions)
    plateau = {r["method"]: r["mape_pct"] for r in first if "mape_pct" in r}
    assert plateau[JOBSCALE] == pytest.approx(0.0, abs=1e-9) and plateau["drift"] > 0  # it knew the plateau
    assert {r["method"] for r in first} == {"last_value", "drift", JOBSCALE}
    with pytest.raises(ValueError, match="variant"):
        read_jobscale_predictions(str(tmp_path / "lofo.csv"), "no_graph")
    pd.DataFrame(rows).drop(columns="p99").to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ValueError, match="p99"):
        read_jobscale_predictions(str(tmp_path / "bad.csv"))


def test_a_scrape_is_never_served_by_a_finer_task_than_its_step() -> None:
    from dprobe.forecaster.runtime import TrainedForecaster

    f = TrainedForecaster()
    f.tasks = [TaskSpec("gpu_memory_bytes", "alibaba-genai-2026", (5, 15, 30), 57.0, (), 1.0),
               TaskSpec("gpu_memory_bytes", "h200-profiles", JOB_LEAD_STEPS, 0.1, (), 1.0)]
    assert f.task_for("gpu_memory_bytes", 15.0)[0] == 0  # closer to 0.1 s in log terms, but finer
    assert f.task_for("gpu_memory_bytes", 0.1)[0] == 1
    assert f.task_for("gpu_memory_bytes", 60.0)[0] == 0
    assert f.task_for("gpu_memory_bytes", 1000.0)[0] == 0  # nothing as coarse: the closest, which refuses


@pytest.mark.slow
def test_the_h200_layout_copied_elsewhere_loads_the_same(tmp_path) -> None:
    for name in ("runs.csv", "samples.csv", "steps.csv", "env.json"):
        shutil.copy(H200 / name, tmp_path / name)
    ds = load_series_dataset(tmp_path)
    assert ds.name == "h200-profiles" and ds.groups is not None and len(ds.series_ids) > 100


@pytest.mark.slow
def test_exp_jobs_trains_on_job_series_and_reports_them(tmp_path, small_alibaba_dir, small_jobs_dir, capsys) -> None:
    """+exp=jobs with tiny settings: the checkpoint has the job tasks and a known-workload path, and the run
    writes jobs.md with the test families' runs beside persistence and the unknown-workload embedding."""
    import torch

    from dprobe.config import compose
    from dprobe.training import run

    cfg = compose(["+exp=jobs", f"paths.output_dir={tmp_path}", f"data.datasets=[{small_alibaba_dir},{small_jobs_dir}]",
                   "data.samples_per_epoch=256", "data.val_samples=64", "data.batch_size=32", "model.d_model=16",
                   "model.n_layers=1", "trainer.max_epochs=1", "trainer.accelerator=cpu",
                   "trainer.enable_progress_bar=false", "coldstart.enabled=false", "jobscale.enabled=false"])
    summary = run(cfg)
    ckpt = torch.load(summary["checkpoint"], weights_only=True)
    assert [t["dataset"] for t in ckpt["tasks"]].count("h200-profiles") == 2 and ckpt["workloads_trained"]
    text = Path(summary["job_series"]["report"]).read_text()
    assert "| dprobe_unknown_workload |" in text and "| last_value |" in text
    assert "3 runs of 1 model family never trained on (squeezenet)" in text  # the small set's test family
    report = (tmp_path / "report.md").read_text()
    assert "### h200-profiles" in report
    # the benchmark prints the same report from the checkpoint and a job-scale lofo.csv; --check fails on a miss
    import importlib.util

    mem = load_series_dataset(small_jobs_dir).arrays("gpu_memory_bytes")  # a job-scale model that knew each plateau
    plateau = {u: float(np.nanquantile(y[JOB_FIRST_ORIGIN + 1: JOB_FIRST_ORIGIN + 101], 0.9)) for u, y in mem.items()}
    pd.DataFrame([{"run_id": u, "family": "x", "variant": "graph", "target": t, "p50": p if t[0] == "m" else 0.5,
                   "p90": p, "p99": p} for u, p in plateau.items() for t in ("memory_plateau_bytes", "gpu_utilization")]
                 ).to_csv(tmp_path / "lofo.csv")
    spec = importlib.util.spec_from_file_location("forecaster_jobs", ROOT / "benchmarks" / "forecaster_jobs.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = ["--checkpoint", summary["checkpoint"], "--data", str(small_jobs_dir), "--jobscale-predictions",
            str(tmp_path / "lofo.csv"), "--cache", str(tmp_path / "cache")]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert "| jobscale |" in out and "memory plateau over the next 10 s" in out
    assert bench.main([*args, "--check"]) == (1 if "MISSED" in out else 0)
    from dprobe.forecaster.checkpoint import export_checkpoint
    from dprobe.forecaster.module import ForecasterModule
    from dprobe.forecaster.tasks import TaskSpec

    series_only = export_checkpoint(ForecasterModule(n_tasks=1, context_length=32, d_model=16, n_heads=2, n_layers=1),
                                    [TaskSpec("gpu_memory_bytes", "alibaba-genai-2026", (5, 15, 30), 57.0, (), 1e9)],
                                    tmp_path / "series.pt")
    assert bench.main(["--checkpoint", str(series_only)]) == 2  # no job tasks


def test_a_forecaster_without_job_tasks_is_refused_on_jobs(jobs) -> None:
    other = _Drift(0.0)
    other.tasks = [TaskSpec("gpu_memory_bytes", "alibaba-genai-2026", (5, 15, 30), 57.0, (), 1.0)]
    with pytest.raises(ValueError, match=r"without h200-profiles's job series.*\+exp=jobs"):
        evaluate_jobs(jobs, {"dprobe": other})
    assert evaluate_jobs(jobs, {}).rows  # the baselines alone still score
