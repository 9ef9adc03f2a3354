"""What ``python train.py`` does: fit the forecaster, export its checkpoint, evaluate it, train the profiler."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


def _instantiate_dict(section: DictConfig | None) -> list:
    return [instantiate(c) for c in (section or {}).values() if c is not None and "_target_" in c]


def stage(section: DictConfig) -> Callable[..., Any]:
    """A stage's function with its configured arguments bound: its config group (``conf/evaluate``,
    ``conf/coldstart``, ``conf/jobscale``: ``_target_``, ``_partial_: true``) less ``enabled``, which is
    :func:`run`'s switch, not an argument."""
    node = OmegaConf.to_container(section, resolve=True)
    node.pop("enabled")
    return instantiate(node, _convert_="all")


def best_val_pinball(trainer: pl.Trainer) -> float | None:
    """The validation pinball loss of the epoch kept (the best checkpoint's on ``val/pinball``), or of the
    last validation where none is kept (``fast_dev_run``); None without a validation."""
    callback = trainer.checkpoint_callback
    score = callback.best_model_score if callback is not None and callback.monitor == "val/pinball" else None
    if score is None:
        score = trainer.callback_metrics.get("val/pinball")
    return None if score is None else float(score)


def started_as_rank_zero() -> bool:
    """Whether this process is rank zero of its run, from the variables launchers set before a trainer exists
    (torchrun: ``RANK``; SLURM: ``SLURM_PROCID``; Lightning's own launcher: ``NODE_RANK`` and
    ``LOCAL_RANK``); True in a single-process run."""
    for name in ("RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").strip():
            return os.environ[name].strip() == "0"
    return all(os.environ.get(name, "0").strip() in ("", "0") for name in ("NODE_RANK", "LOCAL_RANK"))


def train_forecaster(cfg: DictConfig, out_dir: Path) -> tuple[Path | None, float | None]:
    """Fit the forecaster on ``cfg.data`` and write the inference checkpoint ``dprobe.pt``; returns its path
    and the validation pinball loss (:func:`best_val_pinball`). In a multi-process run (``trainer=ddp``)
    every rank fits, and only rank zero goes on to the point choice, calibration and export: the other
    ranks return ``(None, val_pinball)``."""
    from dprobe.forecaster.calibration import build_checkpoint
    from dprobe.forecaster.checkpoint import save_checkpoint
    from dprobe.forecaster.module import ForecasterModule
    from dprobe.forecaster.onnx_export import export_onnx

    if cfg.trainer.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError("trainer=gpu needs a CUDA GPU, and torch sees none; trainer=default uses one when there "
                         "is one, trainer=cpu never")
    datamodule = instantiate(cfg.data, _convert_="all")
    datamodule.setup("fit")
    model = instantiate(cfg.model, n_tasks=len(datamodule.tasks), _convert_="all")
    trainer: pl.Trainer = instantiate(cfg.trainer, callbacks=_instantiate_dict(cfg.get("callbacks")),
                                      logger=_instantiate_dict(cfg.get("logger")) or False)
    trainer.fit(model, datamodule=datamodule)
    val_pinball = best_val_pinball(trainer)
    if not trainer.is_global_zero:
        return None, val_pinball
    best = getattr(trainer.checkpoint_callback, "best_model_path", "") if trainer.checkpoint_callback else ""
    if best and Path(best).is_file():
        model = ForecasterModule.load_from_checkpoint(best, weights_only=True, map_location="cpu")
        log.info("best epoch checkpoint: %s", best)
    # point choice and calibration on the validation windows (on the CPU, wherever training ran)
    obj = build_checkpoint(model, datamodule, select_point=cfg.select_point,
                           calibrate_quantiles=cfg.calibrate_quantiles)
    path = save_checkpoint(obj, out_dir / "dprobe.pt")
    export_onnx(obj, out_dir / "dprobe.onnx")  # for the sidecar: no torch needed
    return path, val_pinball


def evaluate_checkpoint(checkpoint: Path, out_dir: Path, datasets: list[str], cache_dir: str | None) -> dict:
    """Score the checkpoint beside every baseline on each of ``datasets``; write report.md/json. ``cache_dir``:
    model graphs and replays of the workloads a directory's workloads.csv names (``conf/evaluate/default.yaml``:
    :func:`run` calls its partial)."""
    from dprobe.data import load_series_dataset
    from dprobe.data.workloads import workload_graphs
    from dprobe.evaluation import EvalConfig, evaluate_dataset
    from dprobe.evaluation.report import markdown_table, plot_forecasts
    from dprobe.forecaster.loading import load_forecaster

    forecaster = load_forecaster(str(checkpoint))
    reports, tables = [], []
    for directory in datasets:
        ds = load_series_dataset(directory)
        graphs = workload_graphs(directory, cache_dir=cache_dir)  # workloads.csv, if any
        # the test span of the split the checkpoint records: what it did not train on
        result = evaluate_dataset(ds, models={"dprobe": forecaster}, cfg=EvalConfig(split=forecaster.split),
                                  graphs=graphs)
        reports.append(result.to_json())
        tables.append(markdown_table(result))
        plot_forecasts(result, out_dir / f"forecasts-{ds.name}.png", methods=["last_value", "dprobe"],
                       lead_index=0 if ds.groups is not None else 1)  # a job's runs are seconds long
    (out_dir / "report.json").write_text(json.dumps(reports, indent=1))
    (out_dir / "report.md").write_text("\n".join(tables))
    print("\n".join(tables))
    return {"report": str(out_dir / "report.md"), "rows": reports}


class _DropTips(logging.Filter):
    """Lightning's advertising tips (e.g. for a cloud logger), printed at every trainer start."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


_DROP_TIPS = _DropTips()


def check_profiles(cfg: DictConfig) -> None:
    """Load each h200-profiles directory an enabled stage reads, so that a wrong path fails at the start,
    not after the forecaster's minutes of training."""
    from dprobe.data import load_h200_profiles

    for name in ("coldstart", "jobscale"):
        if cfg[name].enabled:
            load_h200_profiles(cfg[name].data_dir)


def train_profilers(cfg: DictConfig, out_dir: Path, workers: int | None = None, progress: bool = True) -> dict:
    """The two h200-profiles models: the cold-start profiler, then the job-scale model (which reads the
    profiler's leave-family-out utilisation); ``workers``: processes for their replays and folds (default
    ``coldstart.workers`` and ``jobscale.workers``). Returns ``{"summary": {...}, "tables": [...]}`` for
    :func:`run`."""
    cache = out_dir / "cache"  # model graphs and replays, shared by the two models
    bound = {"workers": workers} if workers else {}
    summary: dict = {}
    tables: list[str] = []
    cs: dict = {}
    if cfg.coldstart.enabled:
        cs = stage(cfg.coldstart)(out_dir=str(out_dir / "coldstart"), cache_dir=cache, progress=progress, **bound)
        tables.append(cs["table"])
        summary["coldstart_checkpoint"] = str(cs["checkpoint"])
        summary["coldstart_metrics"] = cs.get("metrics", {})
        summary["coldstart_plot"] = cs.get("plot")
    if cfg.jobscale.enabled:
        # the cold-start profiler's leave-family-out predictions, where it scored the same runs
        same_runs = cfg.coldstart.data_dir == cfg.jobscale.data_dir
        js = stage(cfg.jobscale)(out_dir=str(out_dir / "jobscale"), cache_dir=cache, progress=progress,
                                 coldstart_util=cs.get("cv_util") if same_runs else None, **bound)
        tables.append(js["table"])
        summary["jobscale_checkpoint"] = js["checkpoint"]
        summary["jobscale_report"] = js["report"]
        summary["jobscale_plot"] = js.get("plot")
        summary["jobscale_predictions"] = js.get("predictions")
    return {"summary": summary, "tables": tables}


PROFILERS_NICENESS = 10  # beside the forecaster, the profilers take the CPU time its threads leave


def _train_profilers_here(cfg: dict, out_dir: str, workers: int) -> dict:
    """:func:`train_profilers` in a second process, at a lower priority (its workers inherit it) and torch on
    one thread: its log goes to ``out_dir/profilers.log`` (warnings also to stderr), and no progress bars,
    which would garble the forecaster's."""
    with contextlib.suppress(AttributeError, OSError):  # os.nice: Unix only
        os.nice(PROFILERS_NICENESS)
    torch.set_num_threads(1)
    handler = logging.FileHandler(Path(out_dir) / "profilers.log")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    console = logging.StreamHandler()
    console.setLevel(logging.WARNING)
    console.setFormatter(logging.Formatter("[profilers][%(levelname)s] %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler, console], force=True)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    return train_profilers(OmegaConf.create(cfg), Path(out_dir), workers=workers, progress=False)


def job_series_report(summary: dict, cfg: DictConfig, out_dir: Path) -> str | None:
    """Where the forecaster trained on a data set of whole jobs (h200-profiles), its leave-family-out scores
    there beside persistence, its unknown-workload embedding and the job-scale model trained in the same run
    (:func:`dprobe.evaluation.jobs.job_report`), written to ``jobs.md``; None where it did not."""
    from dprobe.data.registry import detect_dataset
    from dprobe.evaluation.jobs import job_report
    from dprobe.forecaster.loading import load_forecaster

    if "checkpoint" not in summary:
        return None
    for directory in cfg.data.datasets:
        if detect_dataset(directory) == "h200-profiles":
            text, scores = job_report(load_forecaster(summary["checkpoint"]), directory,
                                      summary.get("jobscale_predictions"), cfg.data.workload_cache,
                                      "graph" if cfg.jobscale.use_graph else "no_graph")
            (out_dir / "jobs.md").write_text(text)
            summary["job_series"] = {"report": str(out_dir / "jobs.md"), "targets": scores["targets"]}
            return text
    return None


def side_by_side(cfg: DictConfig) -> tuple[int, int] | None:
    """``(forecaster threads, profiler processes)`` when the h200-profiles models train in a second process
    beside the forecaster (``parallel_stages``); None when they train after it (turned off, nothing to run
    beside the forecaster, or one core). The forecaster takes half the cores; the profilers' processes, one
    per core (at most four, or ``coldstart.workers``), run at a lower priority, so that they fill what the
    forecaster leaves idle, and every core once it is done."""
    from dprobe.core.workers import available_cores, resolve_workers

    cores = available_cores()
    wanted = cfg.parallel_stages and cfg.forecaster_enabled
    if not wanted or not (cfg.coldstart.enabled or cfg.jobscale.enabled) or cores < 2:
        return None
    return max(1, cores // 2), resolve_workers(cfg.coldstart.workers)


def run(cfg: DictConfig) -> dict:
    """Train what the config enables; returns where the checkpoints and reports went, and ``val_pinball``,
    the metric that ``python train.py -m`` sweeps minimise (train.py's main returns it): the forecaster's
    validation pinball loss (:func:`best_val_pinball`; None when the forecaster is not trained).

    The forecaster and the two h200-profiles models are independent: with ``parallel_stages`` (and at
    least two cores) the latter train in a second process from the start (:func:`side_by_side`)."""
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")  # a library-internal deprecation, once a step
    logging.getLogger("pytorch_lightning.utilities.rank_zero").addFilter(_DROP_TIPS)  # once: same object
    pl.seed_everything(cfg.seed, workers=True)
    out_dir = Path(cfg.paths.output_dir)
    summary: dict = {"output_dir": str(out_dir), "val_pinball": None}
    if not started_as_rank_zero():  # a DDP worker that a launcher started: it fits, rank zero does everything else
        if cfg.forecaster_enabled:
            summary["val_pinball"] = train_forecaster(cfg, out_dir)[1]
        return summary
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    check_profiles(cfg)
    split = side_by_side(cfg)
    profilers = None
    threads = torch.get_num_threads()
    if split is not None:
        from dprobe.core.workers import Beside

        profilers = Beside(_train_profilers_here, OmegaConf.to_container(cfg, resolve=True), str(out_dir),
                           split[1], name="dprobe-profilers")
        torch.set_num_threads(split[0])
        log.info("cold-start and job-scale models: training in a second process (%d worker%s, lower priority) "
                 "beside the forecaster (%d thread%s); their log: %s", split[1], "s" * (split[1] > 1), split[0],
                 "s" * (split[0] > 1), out_dir / "profilers.log")
    try:
        if cfg.forecaster_enabled:
            checkpoint, summary["val_pinball"] = train_forecaster(cfg, out_dir)
            if checkpoint is None:  # not rank zero after all (the trainer knows best): nothing more to do
                if profilers is not None:
                    profilers.stop()
                return summary
            summary["checkpoint"] = str(checkpoint)
            if cfg.evaluate.enabled:
                summary["evaluation"] = stage(cfg.evaluate)(checkpoint=checkpoint, out_dir=out_dir)["report"]
    except BaseException:
        if profilers is not None:
            profilers.stop()
        raise
    finally:
        torch.set_num_threads(threads)
    profiled = None
    if profilers is not None:
        if not profilers.done():
            log.info("waiting for the cold-start and job-scale models (log: %s)", out_dir / "profilers.log")
        try:
            profiled = profilers.result()
        except ChildProcessError as exc:  # e.g. killed for memory: train them here instead
            log.warning("%s; training the cold-start and job-scale models in this process", exc)
    if profiled is None and (cfg.coldstart.enabled or cfg.jobscale.enabled):
        profiled = train_profilers(cfg, out_dir)
    if profiled is not None:
        print("\n".join(profiled["tables"]))
        summary.update(profiled["summary"])
    jobs = job_series_report(summary, cfg, out_dir)
    if jobs:
        print(jobs)
    if cfg.get("pretrain") is not None and cfg.pretrain.enabled:  # +exp=pretrain_gnn: conf/pretrain/gnn.yaml
        pretrained = stage(cfg.pretrain)(out_dir=str(out_dir / "pretrain_gnn"))
        summary["graph_encoder"] = pretrained["checkpoint"]
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"\nForecaster checkpoint: {summary.get('checkpoint', '(not trained)')}")
    if "checkpoint" in summary:
        print(f"  for the sidecar:     {Path(summary['checkpoint']).with_suffix('.onnx')} (ONNX, no torch)")
    if "evaluation" in summary:
        print(f"Evaluation report:     {summary['evaluation']}")
    if "coldstart_checkpoint" in summary:
        print(f"Cold-start checkpoint: {summary['coldstart_checkpoint']}"
              + (f" (unseen families: {summary['coldstart_plot']})" if summary.get("coldstart_plot") else ""))
    if "jobscale_checkpoint" in summary:
        print(f"Job-scale checkpoint:  {summary['jobscale_checkpoint']} (report: {summary['jobscale_report']})")
    print(f"Everything else:       {out_dir}")
    return summary
