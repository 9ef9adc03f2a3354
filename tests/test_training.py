"""Compose the real Hydra configs with tiny settings and run them end to end."""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from dprobe.config import CONFIG_DIR, compose
from dprobe.forecaster.base import ForecastInput
from dprobe.profiling.coldstart.kernel_gnn_train import DEV_ROWS
from dprobe.training import StageResult, run, stage, write_stages

ROOT = CONFIG_DIR.parent
EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "exp").glob("*.yaml"))


def tiny(tmp_path: Path, data_dirs: list[Path], *extra: str) -> list[str]:
    dirs = ",".join(str(d) for d in data_dirs)
    return [
        f"paths.output_dir={tmp_path}",
        f"data.datasets=[{dirs}]",
        "data.samples_per_epoch=256",
        "data.val_samples=64",
        "data.batch_size=32",
        "model.d_model=16",
        "model.n_layers=1",
        "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false",
        "logger=csv",
        "jobscale.epochs=5",
        "kernel_gnn.epochs=1",
        *extra,
    ]


@pytest.mark.parametrize("exp", [pytest.param(e, marks=pytest.mark.slow) if e in ("helios", "jobs", "no_graph", "pretrain_gnn") else e
                                 for e in EXPERIMENTS])  # seconds each: the fast tier runs alibaba, coldstart and gnn
def test_every_experiment_composes_and_runs_fast_dev_run(exp, tmp_path, small_alibaba_dir, small_helios_dir,
                                                         monkeypatch):
    """Each exp config composes with the defaults and its run reaches the end (fast_dev_run)."""
    cfg = compose([f"+exp={exp}", *tiny(tmp_path, [small_alibaba_dir, small_helios_dir]),
                   "trainer.fast_dev_run=true", "evaluate.enabled=false"])
    assert cfg.data.datasets and "_target_" in cfg.model
    calls = []
    if cfg.coldstart.enabled:  # the profiler's own tests cover its training; here only the wiring
        import dprobe.profiling.coldstart as coldstart
        from dprobe.data import load_h200_profiles

        def fake_train(data_dir, out_dir, **kw):
            calls.append((data_dir, kw))
            ids = load_h200_profiles(data_dir).train_runs()["run_id"]
            return {"checkpoint": str(Path(out_dir) / "coldstart.pt"), "metrics": {}, "table": "cold-start scores",
                    "cv_util": dict.fromkeys(ids, 0.5)}  # leave-family-out utilisation, for job scale

        monkeypatch.setattr(coldstart, "train_coldstart", fake_train)
        import dprobe.profiling.jobscale.data as jobscale_data

        def no_second_cross_validation(*a, **k):
            raise AssertionError("job scale cross-validated the cold-start profiler again")

        monkeypatch.setattr(jobscale_data, "coldstart_utilisation", no_second_cross_validation)
    if cfg.jobscale.enabled and cfg.jobscale.use_graph:  # graphs and replays of every run: stand-ins here
        import dprobe.profiling.coldstart.dataset as cs_dataset
        from dprobe.data import load_h200_profiles
        from dprobe.graph import build_model_graph
        from dprobe.graph.encoder import graph_to_data
        from dprobe.profiling.coldstart.features import FEATURES

        def fake_dataset(data_dir, cache_dir, **kw):
            ids = list(load_h200_profiles(data_dir).train_runs()["run_id"])
            g = graph_to_data(build_model_graph("torchvision:resnet18", batch=2, image=32))
            feats = np.random.default_rng(0).normal(size=(len(ids), len(FEATURES)))
            base = np.full((len(ids), 4), 4e9)  # analytical estimates: peak, device memory, util, step time
            return cs_dataset.make_dataset([g] * len(ids), feats, base, np.ones((len(ids), 4)), ids, ids)

        monkeypatch.setattr(cs_dataset, "load_dataset", fake_dataset)
    summary = run(cfg)
    assert Path(summary["output_dir"], "config.yaml").is_file()
    if cfg.forecaster_enabled:
        ckpt = torch.load(summary["checkpoint"], weights_only=True)
        assert ckpt["kind"] == "dprobe-forecaster"
    # stages.json: every stage of run() in order, what it wrote and how long it took, or why it did not run
    stages = {s["name"]: s for s in json.loads(Path(summary["output_dir"], "stages.json").read_text())}
    assert list(stages) == ["forecaster", "evaluate", "coldstart", "jobscale", "job_series", "kernel_gnn",
                            "pretrain"]
    assert stages["evaluate"]["skipped"] in ("evaluate.enabled=false",
                                             "no forecaster checkpoint (forecaster_enabled=false)")
    for name, enabled in (("forecaster", cfg.forecaster_enabled), ("coldstart", cfg.coldstart.enabled),
                          ("jobscale", cfg.jobscale.enabled), ("kernel_gnn", cfg.kernel_gnn.enabled),
                          ("pretrain", cfg.get("pretrain") is not None and cfg.pretrain.enabled)):
        assert (stages[name]["skipped"] is None) == enabled, name
        assert (stages[name]["seconds"] > 0) == enabled, name
    assert cfg.kernel_gnn.enabled == (exp in ("gnn", "jobs"))  # +exp=gnn runs the graph network (jobs: gnn and more)
    if cfg.kernel_gnn.enabled:
        assert set(stages["kernel_gnn"]["metrics"]) == {"gnn_mape", "vector_mape", "rule_mape"}
        assert torch.load(stages["kernel_gnn"]["outputs"]["checkpoint"], weights_only=True)["state_dict"]
        report = json.loads(Path(stages["kernel_gnn"]["outputs"]["report"]).read_text())
        assert report["epochs"] == 1 and 0 < report["rows_fitted"] <= DEV_ROWS  # fast_dev_run: a few rows
        assert 0 < report["rows_held_out"] <= DEV_ROWS // 3
    if cfg.forecaster_enabled:
        assert stages["forecaster"]["outputs"] == {"checkpoint": summary["checkpoint"],
                                                   "onnx": str(Path(summary["output_dir"], "dprobe.onnx"))}
        assert stages["forecaster"]["metrics"]["val_pinball"] == summary["val_pinball"]
    if cfg.jobscale.enabled:
        assert stages["jobscale"]["outputs"]["report"] == summary["jobscale_report"]
    if cfg.coldstart.enabled:
        assert calls and calls[0][0].endswith("h200-profiles")
        assert calls[0][1]["progress"] is False  # stderr is no terminal here: stage lines, no bars
    if cfg.jobscale.enabled:
        report = Path(summary["jobscale_report"]).read_text()
        assert "| persist |" in report and "| no_graph |" in report
        assert ("| graph |" in report) == bool(cfg.jobscale.use_graph)
        assert torch.load(summary["jobscale_checkpoint"], weights_only=True)["kind"] == "dprobe-jobscale"


def _train_main():
    """train.py's @hydra.main function (train.py is a script, not a module of the package)."""
    spec = importlib.util.spec_from_file_location("train", CONFIG_DIR.parent / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.slow
def test_training_writes_checkpoint_that_evaluates(tmp_path, small_alibaba_dir, small_helios_dir, capsys, caplog):
    """Two short epochs, best checkpoint exported, then scored against every baseline on both data sets;
    train.py's main returns the best epoch's validation pinball loss (what sweeps minimise)."""
    cfg = compose(tiny(tmp_path, [small_alibaba_dir, small_helios_dir], "trainer.max_epochs=2"))
    with caplog.at_level(logging.INFO, logger="pytorch_lightning"):
        val_pinball = _train_main()(cfg)
    assert not [r for r in caplog.records if "Tip:" in r.getMessage()]  # Lightning's advertising is dropped
    summary = json.loads(Path(tmp_path, "summary.json").read_text())
    logged = [float(v) for v in pd.read_csv(tmp_path / "logs" / "version_0" / "metrics.csv")["val/pinball"].dropna()]
    assert len(logged) == 2 and val_pinball == summary["val_pinball"] == pytest.approx(min(logged))
    out = capsys.readouterr().out
    assert "Forecaster checkpoint:" in out and "Evaluation report:" in out
    reports = json.loads(Path(tmp_path, "report.json").read_text())
    assert {r["dataset"] for r in reports} == {"alibaba-genai-2026", "helios-earth-vc"}
    for report in reports:
        methods = {row["method"] for row in report["rows"]}
        assert {"dprobe", "last_value", "ets"} <= methods
        for row in report["rows"]:
            if row["method"] == "dprobe":
                assert np.isfinite(row["mae"]) and row["n_forecasts"] > 0
                assert 0.0 <= row["coverage_p90"] <= 1.0
    assert Path(tmp_path, "forecasts-helios-earth-vc.png").stat().st_size > 10_000

    # the checkpoint alone is enough to forecast, and loads with weights_only=True
    from dprobe.forecaster.loading import load_forecaster

    model = load_forecaster(summary["checkpoint"])
    onnx_model = load_forecaster(str(Path(summary["checkpoint"]).with_suffix(".onnx")))
    window = np.linspace(10, 20, 50)[None, :]
    f = model.predict(ForecastInput(values=window, metric="gpu_demand", leads=(6, 24), step_seconds=300))
    assert f.point.shape == (1, 2) and f.quantiles.shape == (1, 2, 3)
    same = onnx_model.predict(ForecastInput(values=window, metric="gpu_demand", leads=(6, 24), step_seconds=300))
    np.testing.assert_allclose(same.quantiles, f.quantiles, rtol=1e-4)
    assert np.all(np.diff(f.quantiles, axis=-1) >= 0)
    with pytest.raises(ValueError, match="trained for leads up to 24 steps"):
        model.predict(ForecastInput(values=window, metric="gpu_demand", leads=(30,), step_seconds=300))
    with pytest.raises(ValueError, match="not 'power_watts'"):
        model.predict(ForecastInput(values=window, metric="power_watts", leads=(6,), step_seconds=300))


@pytest.mark.slow
def test_evaluate_cli_scores_a_checkpoint(tmp_path, small_alibaba_dir, small_helios_dir, capsys):
    from dprobe.cli import main

    summary = run(compose(tiny(tmp_path, [small_alibaba_dir, small_helios_dir], "trainer.fast_dev_run=true",
                               "evaluate.enabled=false")))
    capsys.readouterr()
    assert main(["evaluate", "--data", str(small_alibaba_dir), "--checkpoint", summary["checkpoint"],
                 "--json", "--baselines", "last_value"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    dprobe_rows = [r for r in rows if r["method"] == "dprobe"]
    assert {r["lead_steps"] for r in dprobe_rows} == {5, 15, 30}
    assert {r["target"] for r in dprobe_rows} == {"gpu_duty_cycle_pct", "gpu_memory_bytes"}
    # a cluster that exports memory only and scrapes no request rates: its one target, no covariates
    partial = tmp_path / "memory-only"
    partial.mkdir()
    shutil.copy(small_alibaba_dir / "pod_gpu_memory_used_bytes_anon.csv.gz", partial)
    assert main(["evaluate", "--data", str(partial), "--checkpoint", summary["checkpoint"], "--json",
                 "--baselines", "last_value"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["target"] for r in rows} == {"gpu_memory_bytes"} and {r["method"] for r in rows} == {"dprobe",
                                                                                                   "last_value"}
    assert all(np.isfinite(r["mae"]) and r["n_forecasts"] > 0 for r in rows)
    # the same checkpoint's gpu_demand task drives the simulator's forecast policy, at its own 300 s step
    assert main(["simulate", "quota", "--checkpoint", summary["checkpoint"], "--start-day", "30", "--days", "1",
                 "--policies", "reactive,forecast", "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["forecaster"].startswith("dprobe") and summary["checkpoint"] in report["forecaster"]
    reactive, forecast = report["policies"]
    assert forecast["policy"] == "forecast" and forecast["jobs"] == reactive["jobs"] > 0
    assert 0 < forecast["gpu_hours_used"] <= forecast["gpu_hours_provisioned"]


def test_bad_checkpoint_is_refused_by_name(tmp_path, small_helios_dir, capsys):
    from dprobe.cli import main

    bad = tmp_path / "broken.pt"
    bad.write_bytes(b"not a checkpoint")
    assert main(["evaluate", "--data", str(small_helios_dir), "--checkpoint", str(bad)]) == 2
    assert "broken.pt" in capsys.readouterr().err


def test_trainer_gpu_without_a_gpu_says_what_to_use(tmp_path, small_helios_dir, monkeypatch):
    """trainer=gpu on a machine where torch sees no GPU: refused with the options that work, before any data."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = compose(tiny(tmp_path, [small_helios_dir], "trainer=gpu", "trainer.accelerator=gpu"))
    with pytest.raises(ValueError, match="trainer=gpu needs a CUDA GPU, and torch sees none; trainer=default"):
        run(cfg)


def test_a_stage_result_is_one_log_line_and_json(tmp_path):
    """A stage's result: one line for the log (its time, numbers and files), and its fields in stages.json."""
    fitted = StageResult("forecaster", outputs={"checkpoint": str(tmp_path / "dprobe.pt")},
                         metrics={"val_pinball": np.float32(0.25), "targets": ["a line"]}, seconds=12.34)
    assert fitted.line() == "stage forecaster: 12.3 s; val_pinball 0.25; dprobe.pt"
    off = StageResult("coldstart", skipped="coldstart.enabled=false")
    assert off.line() == "stage coldstart: skipped (coldstart.enabled=false)"
    write_stages([fitted, off], tmp_path / "stages.json")
    assert json.loads((tmp_path / "stages.json").read_text()) == [
        {"name": "forecaster", "outputs": {"checkpoint": str(tmp_path / "dprobe.pt")},
         "metrics": {"val_pinball": 0.25, "targets": ["a line"]}, "seconds": 12.34, "skipped": None},
        {"name": "coldstart", "outputs": {}, "metrics": {}, "seconds": 0.0, "skipped": "coldstart.enabled=false"}]


def test_a_checkpoint_to_resume_from_that_is_not_there_is_refused_before_training(tmp_path, small_helios_dir):
    """ckpt_path=PATH of no file, or ckpt_path=last where the run directory keeps no last.ckpt: refused by name
    before any data is read or anything trains."""
    missing = tmp_path / "nowhere.ckpt"
    with pytest.raises(FileNotFoundError, match=f"ckpt_path={missing}: no such checkpoint file"):
        run(compose(tiny(tmp_path, [small_helios_dir], f"ckpt_path={missing}")))
    last = tmp_path / "checkpoints" / "last.ckpt"
    with pytest.raises(FileNotFoundError, match=f"ckpt_path=last: no last checkpoint; looked for {last}"):
        run(compose(tiny(tmp_path, [small_helios_dir], "ckpt_path=last")))
    assert not (tmp_path / "dprobe.pt").exists() and not (tmp_path / "checkpoints").exists()
    assert compose(tiny(tmp_path, [small_helios_dir])).ckpt_path is None  # the default: a fresh fit


@pytest.mark.slow
def test_an_interrupted_fit_resumes_where_it_stopped(tmp_path, small_helios_dir, monkeypatch):
    """One epoch with its last checkpoint kept; resumed with ckpt_path=last in the same run directory, or from
    the file into another, the fit goes on at the second epoch, its optimizer steps counted on."""
    from dprobe.forecaster.progress import EpochProgress

    starts = []  # (epoch, optimizer steps) at each epoch's start
    original = EpochProgress.on_train_epoch_start

    def recorded(self, trainer, pl_module):
        starts.append((trainer.current_epoch, trainer.global_step))
        original(self, trainer, pl_module)

    monkeypatch.setattr(EpochProgress, "on_train_epoch_start", recorded)
    first = tmp_path / "first"
    run(compose(tiny(first, [small_helios_dir], "trainer.max_epochs=1", "evaluate.enabled=false")))
    steps = 256 // 32  # data.samples_per_epoch / data.batch_size
    assert starts == [(0, 0)] and (first / "checkpoints" / "last.ckpt").is_file()
    saved = torch.load(first / "checkpoints" / "last.ckpt", weights_only=True)
    assert (saved["epoch"], saved["global_step"]) == (0, steps)
    starts.clear()
    summary = run(compose(tiny(first, [small_helios_dir], "trainer.max_epochs=2", "evaluate.enabled=false",
                               "ckpt_path=last")))
    assert starts == [(1, steps)]  # resumed: the second epoch only
    resumed = torch.load(first / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == 2 * steps
    assert torch.load(summary["checkpoint"], weights_only=True)["kind"] == "dprobe-forecaster"
    logged = pd.read_csv(first / "logs" / "version_1" / "metrics.csv")  # the resumed fit's log
    assert set(logged["epoch"].dropna()) == {1}
    starts.clear()
    run(compose(tiny(tmp_path / "second", [small_helios_dir], "trainer.max_epochs=2", "evaluate.enabled=false",
                     f"ckpt_path={first / 'checkpoints' / 'best.ckpt'}")))
    assert starts == [(1, steps)]


@pytest.mark.slow
def test_dprobe_train_hands_hydra_its_overrides(tmp_path, monkeypatch, capsys):
    """`dprobe train OVERRIDES` runs train.py's Hydra app on OVERRIDES; the run itself sees the command line
    it was started with (Lightning's DDP launcher starts its other processes with it); `dprobe train --help`
    is Hydra's help, with the config groups."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    import dprobe.training as training
    from dprobe.cli import main

    seen = {}

    def fake_run(cfg):
        seen["cfg"], seen["output_dir"], seen["argv"] = cfg, cfg.paths.output_dir, list(sys.argv)
        return {"val_pinball": 0.5}

    monkeypatch.setattr(training, "run", fake_run)
    argv = ["dprobe", "train", "+exp=gnn", "trainer.max_epochs=1", f"hydra.run.dir={tmp_path}/run",
            "hydra/job_logging=none", "hydra/hydra_logging=none"]
    monkeypatch.setattr(sys, "argv", argv)
    try:
        assert main(argv[1:]) == 0
        assert seen["cfg"].model.use_graph and seen["cfg"].trainer.max_epochs == 1
        assert seen["output_dir"] == f"{tmp_path}/run"
        assert seen["argv"] == argv and sys.argv == argv
        assert "trainer.max_epochs=1" in (tmp_path / "run" / ".hydra" / "overrides.yaml").read_text()
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            main(["train", "--help"])
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert "train is powered by Hydra" in out and "exp: alibaba, coldstart, gnn" in out
    finally:
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None


@pytest.mark.slow
def test_the_wheel_ships_the_configs_and_dprobe_train_reads_them(tmp_path):
    """conf/ (at the repository's root) is built into the wheel as dprobe/conf; installed from it, `dprobe train`
    composes from there, in any directory."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for name in ("conf", "dprobe"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", str(src), "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "wheel")],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "wheel").glob("dprobe-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"dprobe/conf/train.yaml", "dprobe/conf/exp/gnn.yaml", "dprobe/conf/trainer/ddp.yaml"} <= names
    assert {f"dprobe/conf/{p.relative_to(CONFIG_DIR)}" for p in CONFIG_DIR.rglob("*.yaml")} <= names
    site = tmp_path / "site"
    subprocess.run([*pip, "install", str(wheel), "--no-deps", "--target", str(site)], check=True,
                   capture_output=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-m", "dprobe.cli", "train", "+exp=gnn", "--info", "searchpath"],
                          cwd=elsewhere, env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"file://{site / 'dprobe' / 'conf'}" in done.stdout, done.stdout


@pytest.mark.slow
def test_ddp_spawn_two_processes(tmp_path, small_helios_dir):
    """trainer=ddp trains with Lightning's DDP strategy (ddp_spawn, 2 CPU processes)."""
    cfg = compose(tiny(tmp_path, [small_helios_dir], "trainer=ddp", "trainer.strategy=ddp_spawn",
                       "trainer.devices=2", "trainer.max_epochs=1", "evaluate.enabled=false"))
    summary = run(cfg)
    ckpt = torch.load(summary["checkpoint"], weights_only=True)
    assert ckpt["tasks"][0]["name"] == "gpu_demand"


@pytest.mark.parametrize("group", ["data", "trainer", "logger", "callbacks", "model", "evaluate", "coldstart",
                                   "jobscale"])
def test_every_option_of_every_group_composes(group, tmp_path):
    """Each config file of each group composes with the defaults and instantiates its target(s)."""
    from hydra.utils import instantiate

    for option in sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml")):
        cfg = compose([f"{group}={option}", f"paths.output_dir={tmp_path}"])
        section = cfg[group]
        assert section, f"{group}={option} is empty"
        if group == "trainer" and section.accelerator == "gpu":
            continue  # needs a GPU to instantiate
        if group == "model":
            assert instantiate(section, n_tasks=2).net is not None
        elif group in ("evaluate", "coldstart", "jobscale"):  # a stage: its function, called later with data
            assert isinstance(stage(section), functools.partial)
        elif group == "data":
            assert all(str(d).startswith(str(CONFIG_DIR.parent)) for d in section.datasets)
        elif "_target_" in section:
            instantiate(section)
        else:
            [instantiate(c) for c in section.values()]


def test_stages_are_their_functions_with_the_configured_arguments(tmp_path):
    """`+exp=gnn` switches the profilers on and the graph path; each stage binds what its group sets and
    leaves what run() produces (where to write, the checkpoint, the shared cache) to the call."""
    from dprobe.profiling.coldstart import train_coldstart
    from dprobe.profiling.jobscale import train_jobscale
    from dprobe.training import evaluate_checkpoint

    cfg = compose(["+exp=gnn", f"paths.output_dir={tmp_path}"])
    assert cfg.model.use_graph and cfg.coldstart.enabled and cfg.jobscale.enabled and cfg.evaluate.enabled
    profiles = str(CONFIG_DIR.parent / "datasets" / "h200-profiles")
    coldstart, jobscale, evaluate = stage(cfg.coldstart), stage(cfg.jobscale), stage(cfg.evaluate)
    assert coldstart.func is train_coldstart and coldstart.keywords == {
        "data_dir": profiles, "benchmarks": [str(CONFIG_DIR.parent / "datasets" / "timm-train-rtx3090")],
        "max_epochs": 400, "seed": 0, "folds": 20, "workers": None}
    assert jobscale.func is train_jobscale and jobscale.keywords == {
        "data_dir": profiles, "use_graph": True, "graph_dim": 0, "epochs": 300, "seed": 0, "folds": 20,
        "workers": None, "fast_dev_run": False}
    assert evaluate.func is evaluate_checkpoint and evaluate.keywords == {
        "datasets": list(cfg.data.datasets), "cache_dir": f"{tmp_path}/cache"}
    off = compose(["+exp=no_graph", "seed=3", "coldstart.workers=2", f"paths.output_dir={tmp_path}"])
    assert not off.coldstart.enabled and off.jobscale.enabled and not off.model.use_graph
    bound = stage(off.jobscale).keywords  # the seed and coldstart.workers follow their keys
    assert (bound["use_graph"], bound["seed"], bound["workers"]) == (False, 3, 2)
    dev = compose(["+exp=gnn", "trainer.fast_dev_run=true", f"paths.output_dir={tmp_path}"])
    assert stage(dev.jobscale).keywords["fast_dev_run"] and stage(dev.kernel_gnn).keywords["fast_dev_run"]


def test_optimizer_and_schedule_come_from_the_config(tmp_path):
    """configure_optimizers builds what conf/model/forecaster.yaml names: AdamW at model.lr and
    model.weight_decay, one cosine cycle over trainer.max_epochs; neither is a checkpoint hyperparameter."""
    import pytorch_lightning as pl
    from hydra.utils import instantiate

    cfg = compose(["+exp=gnn", f"paths.output_dir={tmp_path}", "model.lr=0.003"])
    module = instantiate(cfg.model, n_tasks=2, _convert_="all")
    assert "optimizer" not in module.hparams and "scheduler" not in module.hparams
    assert module.hparams.lr == 0.003 and module.hparams.weight_decay == 1e-4  # recorded in the checkpoint
    module.trainer = pl.Trainer(max_epochs=7, accelerator="cpu", logger=False, enable_checkpointing=False)
    configured = module.configure_optimizers()
    opt, sched = configured["optimizer"], configured["lr_scheduler"]
    reference = torch.optim.AdamW(module.parameters(), lr=0.003, weight_decay=1e-4)
    assert type(opt) is torch.optim.AdamW and opt.defaults == reference.defaults
    assert isinstance(sched, torch.optim.lr_scheduler.CosineAnnealingLR) and sched.T_max == 7
    module.make_scheduler = None  # model.scheduler=null: a constant learning rate
    assert isinstance(module.configure_optimizers(), torch.optim.AdamW)


@pytest.mark.slow
def test_a_sweep_runs_each_value_in_its_own_directory(tmp_path, small_helios_dir):
    """`python train.py -m model.lr=A,B`: two runs, each in a numbered directory of the sweep's, where
    paths.output_dir (Hydra's run directory) puts all its outputs."""
    sweep = tmp_path / "sweep"
    overrides = [o for o in tiny(tmp_path, [small_helios_dir]) if not o.startswith("paths.output_dir=")]
    subprocess.run([sys.executable, str(CONFIG_DIR.parent / "train.py"), "-m", "model.lr=0.001,0.003",
                    "trainer.fast_dev_run=true", "evaluate.enabled=false", f"hydra.sweep.dir={sweep}",
                    *overrides], check=True, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    for num, lr in ((0, 0.001), (1, 0.003)):
        run_dir = sweep / str(num)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["output_dir"] == str(run_dir) and Path(summary["checkpoint"]).parent == run_dir
        assert np.isfinite(summary["val_pinball"])
        assert torch.load(summary["checkpoint"], weights_only=True)["hparams"]["lr"] == lr
        assert f"model.lr={lr}" in (run_dir / ".hydra" / "overrides.yaml").read_text()  # Hydra's own record
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]


@pytest.mark.slow
def test_a_sweep_runs_side_by_side_with_the_joblib_launcher(tmp_path, small_helios_dir):
    """`python train.py -m hydra/launcher=joblib hydra.launcher.n_jobs=2 model.lr=A,B` (the `sweep` extra):
    both runs at once, each in its numbered directory."""
    sweep = tmp_path / "sweep"
    overrides = [o for o in tiny(tmp_path, [small_helios_dir]) if not o.startswith("paths.output_dir=")]
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=joblib",
                           "hydra.launcher.n_jobs=2", "model.lr=0.001,0.003", "trainer.fast_dev_run=true",
                           "evaluate.enabled=false", f"hydra.sweep.dir={sweep}", *overrides],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Joblib.Parallel(n_jobs=2" in done.stdout + done.stderr
    for num, lr in ((0, 0.001), (1, 0.003)):
        summary = json.loads((sweep / str(num) / "summary.json").read_text())
        assert torch.load(summary["checkpoint"], weights_only=True)["hparams"]["lr"] == lr


def _profiler_outputs(summary: dict) -> tuple[dict, dict]:
    cold = torch.load(summary["coldstart_checkpoint"], weights_only=True)
    job = torch.load(summary["jobscale_checkpoint"], weights_only=True)
    return cold["state_dict"], job["state_dict"]


@pytest.mark.slow
def test_profilers_train_beside_the_forecaster_with_the_same_results(tmp_path, small_alibaba_dir, small_h200_dir,
                                                                       monkeypatch, capsys):
    """With ``parallel_stages`` the h200-profiles models train in a second process while the forecaster trains
    on half the cores; every model is the one trained without it, but for the last digits."""
    import dprobe.core.workers as workers
    from dprobe.training import side_by_side

    monkeypatch.setattr(workers, "available_cores", lambda: 2)  # as on the 2-core reference machine
    profiles = [f"coldstart.data_dir={small_h200_dir}", f"jobscale.data_dir={small_h200_dir}",
                "coldstart.max_epochs=5", "coldstart.folds=2", "jobscale.folds=2", "evaluate.enabled=false",
                "trainer.max_epochs=1"]
    runs = {}
    for parallel in (True, False):
        cfg = compose(["+exp=gnn", *tiny(tmp_path / str(parallel), [small_alibaba_dir], *profiles),
                       f"parallel_stages={parallel}"])
        assert side_by_side(cfg) == ((1, 2) if parallel else None)  # a thread for the forecaster, 2 processes
        runs[parallel] = run(cfg)
        out = capsys.readouterr().out
        assert "cold start, leave-model-family-out" in out and "Job-scale checkpoint:" in out
    assert (tmp_path / "True" / "profilers.log").read_text().count("features of 8 runs") == 2  # its log is kept
    forecasters = [torch.load(runs[p]["checkpoint"], weights_only=True)["state_dict"] for p in (True, False)]
    for beside, after in [*zip(_profiler_outputs(runs[True]), _profiler_outputs(runs[False]), strict=True),
                          forecasters]:
        assert beside.keys() == after.keys()
        for key, value in beside.items():  # the same models: on fewer threads, equal but for the last digits
            torch.testing.assert_close(value, after[key], atol=1e-3, rtol=1e-3, msg=key)


@pytest.mark.slow
def test_a_failing_profiler_stage_fails_the_run_by_name(tmp_path, small_alibaba_dir, small_h200_dir, monkeypatch):
    """A wrong profiles directory is refused before any training; an error in the second process reaches the
    caller with its message, after the forecaster's outputs are written."""
    import dprobe.core.workers as workers

    monkeypatch.setattr(workers, "available_cores", lambda: 2)
    missing = tmp_path / "nowhere"
    cfg = compose(["+exp=gnn", *tiny(tmp_path, [small_alibaba_dir], f"coldstart.data_dir={missing}",
                                     "parallel_stages=true")])
    with pytest.raises(Exception, match="nowhere: missing file runs.csv"):
        run(cfg)
    assert not (tmp_path / "dprobe.pt").exists()  # refused before the forecaster trained
    cfg = compose(["+exp=gnn", *tiny(tmp_path, [small_alibaba_dir], f"coldstart.data_dir={small_h200_dir}",
                                     f"jobscale.data_dir={small_h200_dir}", "evaluate.enabled=false",
                                     "trainer.max_epochs=1", "coldstart.folds=0", "parallel_stages=true")])
    with pytest.raises(ValueError, match="folds") as err:
        run(cfg)
    assert "in the process beside" in "".join(getattr(err.value, "__notes__", []))
    assert (tmp_path / "dprobe.pt").is_file()  # the forecaster's work is kept


@pytest.mark.slow
def test_profilers_whose_process_died_train_after_the_forecaster(tmp_path, small_alibaba_dir, small_h200_dir,
                                                                 monkeypatch, caplog):
    """A second process killed (for memory, say) costs time, not the run: the models train in this one."""
    import dprobe.core.workers as workers

    class Died:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def done(self) -> bool:
            return True

        def result(self):
            raise ChildProcessError("dprobe-profilers stopped (exit code -9) before it returned")

        def stop(self) -> None:
            pass

    monkeypatch.setattr(workers, "available_cores", lambda: 2)
    monkeypatch.setattr(workers, "Beside", Died)
    cfg = compose(["+exp=gnn", *tiny(tmp_path, [small_alibaba_dir], f"coldstart.data_dir={small_h200_dir}",
                                     f"jobscale.data_dir={small_h200_dir}", "coldstart.max_epochs=5",
                                     "coldstart.folds=2", "jobscale.folds=2", "evaluate.enabled=false",
                                     "trainer.max_epochs=1", "parallel_stages=true")])
    with caplog.at_level(logging.WARNING, logger="dprobe.training"):
        summary = run(cfg)
    assert "before it returned; training the cold-start and job-scale models in this process" in caplog.text
    assert Path(summary["coldstart_checkpoint"]).is_file() and Path(summary["jobscale_checkpoint"]).is_file()


@pytest.mark.slow
def test_ddp_two_processes_one_output_directory(tmp_path, small_helios_dir):
    """`python train.py trainer=ddp trainer.devices=2`: Lightning starts a second process that runs train.py
    again; both fit, rank zero alone chooses the point, calibrates, exports and evaluates, and both use the
    one run directory (here named to the microsecond, so that a second resolution of ``${now:}`` would
    differ)."""
    runs = tmp_path / "outputs"
    overrides = [o for o in tiny(tmp_path, [small_helios_dir]) if not o.startswith("paths.output_dir")]
    cmd = [sys.executable, str(CONFIG_DIR.parent / "train.py"), *overrides, "trainer=ddp", "trainer.devices=2",
           "trainer.max_epochs=1", "data.val_samples=32", f"hydra.run.dir={runs}/${{now:%H-%M-%S-%f}}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("Forecaster checkpoint:") == 1, done.stdout[-3000:]  # rank zero's summary only
    (run_dir,) = list(runs.iterdir())  # one directory for the run, not one per process
    summary = json.loads((run_dir / "summary.json").read_text())
    assert Path(summary["checkpoint"]).parent == run_dir and (run_dir / "dprobe.onnx").is_file()
    assert (run_dir / "report.json").is_file()
    ckpt = torch.load(run_dir / "dprobe.pt", weights_only=True)
    assert ckpt["tasks"][0]["name"] == "gpu_demand"
    assert not (tmp_path / "lightning_logs").exists() and not list(tmp_path.glob("outputs/*/*/dprobe.pt"))
