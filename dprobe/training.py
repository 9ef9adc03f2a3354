"""What ``python train.py`` (and ``dprobe train``) does, stage by stage: fit the forecaster and export its
checkpoint, evaluate it, train the profilers; each stage's :class:`StageResult` goes to the log and to the run
directory's ``stages.json``."""

from __future__ import annotations

import contextlib
import json
import logging
import numbers
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


@dataclass
class StageResult:
    """What one stage of :func:`run` did: its ``name``, the files it wrote (``outputs``: what each is, its
    path), its scores (``metrics``), its wall time (``seconds``), and where it did not run, why (``skipped``).
    :func:`run` logs each one's :meth:`line` and writes them all to ``stages.json``."""

    name: str
    outputs: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: str | None = None

    def line(self) -> str:
        """One line for the log: ``stage NAME: SECONDS s; its numbers; the files' names``, or why it was
        skipped."""
        if self.skipped is not None:
            return f"stage {self.name}: skipped ({self.skipped})"
        scores = [f"{k} {v:.4g}" for k, v in self.metrics.items()
                  if isinstance(v, numbers.Real) and not isinstance(v, bool)]
        files = [Path(p).name for p in self.outputs.values()]
        return "; ".join([f"stage {self.name}: {self.seconds:.1f} s", *([", ".join(scores)] if scores else []),
                          *([", ".join(files)] if files else [])])


@dataclass
class ProfilerResults:
    """What :func:`train_profilers` returns (from a second process too): the two stages, their entries of
    ``summary.json`` and their tables, printed at the end of the run."""

    stages: list[StageResult]
    summary: dict[str, Any]
    tables: list[str]


def _paths(result: dict, *keys: str) -> dict[str, str]:
    """A stage function's returned paths under ``keys`` that it wrote (None: not written), as strings."""
    return {k: str(result[k]) for k in keys if result.get(k) is not None}


def _json_value(value: Any) -> Any:
    """``json.dumps``'s fallback: numpy numbers and arrays as Python's, anything else as its string."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def write_stages(stages: list[StageResult], path: Path) -> None:
    """``stages.json``: each stage's :class:`StageResult`, in the order they ran."""
    path.write_text(json.dumps([asdict(s) for s in stages], indent=1, default=_json_value))


def _instantiate_dict(section: DictConfig | None) -> list:
    return [instantiate(c) for c in (section or {}).values() if c is not None and "_target_" in c]


def stage(section: DictConfig) -> Callable[..., Any]:
    """A stage's function with its configured arguments bound: its config group (``conf/evaluate``,
    ``conf/coldstart``, ``conf/jobscale``: ``_target_``, ``_partial_: true``) less ``enabled``, which is
    :func:`run`'s switch, not an argument."""
    node = OmegaConf.to_container(section, resolve=True)
    assert isinstance(node, dict), f"a stage's config group is a mapping, got {type(node).__name__}"
    node.pop("enabled")
    return instantiate(node, _convert_="all")


def best_val_pinball(trainer: pl.Trainer) -> float | None:
    """The validation pinball loss of the epoch kept (the best checkpoint's score on ``val/pinball``, or on
    ``val/select`` where it is chosen on that, as ``+exp=gnn`` does), or of the last validation where none is
    kept (``fast_dev_run``); None without a validation."""
    callback: Any = trainer.checkpoint_callback  # a ModelCheckpoint where one is configured
    chosen = callback is not None and callback.monitor in ("val/pinball", "val/select")
    score = callback.best_model_score if chosen else None
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


def resume_checkpoint(cfg: DictConfig) -> str | None:
    """The Lightning checkpoint the forecaster's fit resumes from (its weights, optimizer, schedule, epoch and
    callbacks' state), ``ckpt_path``: None (null) for a fresh fit; a file; or ``last``, the ``last.ckpt`` that
    a ModelCheckpoint callback with ``save_last`` keeps (``callbacks.model_checkpoint``: the run directory's
    ``checkpoints/``, so ``last`` needs the interrupted run's directory, ``hydra.run.dir=DIR``).
    FileNotFoundError, naming what was looked for, where there is none: before anything trains."""
    path = cfg.get("ckpt_path")
    if path is None:
        return None
    if str(path) == "last":
        dirs = [Path(c.dirpath) for c in (cfg.get("callbacks") or {}).values()
                if c is not None and str(c.get("_target_", "")).endswith("ModelCheckpoint") and c.get("save_last")
                and c.get("dirpath")]
        found = [d / "last.ckpt" for d in dirs if (d / "last.ckpt").is_file()]
        if not found:
            where = (", ".join(str(d / "last.ckpt") for d in dirs)
                     or "nowhere (no ModelCheckpoint callback with save_last)")
            raise FileNotFoundError(f"ckpt_path=last: no last checkpoint; looked for {where}. Resume in the "
                                    "interrupted run's directory (hydra.run.dir=DIR ckpt_path=last) or name the "
                                    "file: ckpt_path=DIR/checkpoints/last.ckpt")
        return str(found[0])
    if not Path(path).expanduser().is_file():
        raise FileNotFoundError(f"ckpt_path={path}: no such checkpoint file (a Lightning .ckpt, e.g. "
                                "outputs/DATE_TIME/checkpoints/last.ckpt; null: train from scratch)")
    return str(Path(path).expanduser())


def train_forecaster(cfg: DictConfig, out_dir: Path) -> StageResult:
    """Fit the forecaster on ``cfg.data`` (resuming from :func:`resume_checkpoint`'s, if any) and write the
    inference checkpoint ``dprobe.pt`` and its ONNX export; returns them (``outputs``: ``checkpoint``,
    ``onnx``) and the validation pinball loss (``metrics``: ``val_pinball``, :func:`best_val_pinball`). In a
    multi-process run (``trainer=ddp``) every rank fits, and only rank zero goes on to the point choice,
    calibration and export: the other ranks return ``val_pinball`` alone, no outputs."""
    from dprobe.forecaster.calibration import build_checkpoint
    from dprobe.forecaster.checkpoint import save_checkpoint
    from dprobe.forecaster.module import ForecasterModule
    from dprobe.forecaster.onnx_export import export_onnx

    if cfg.trainer.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError("trainer=gpu needs a CUDA GPU, and torch sees none; trainer=default uses one when there "
                         "is one, trainer=cpu never")
    ckpt_path = resume_checkpoint(cfg)
    datamodule = instantiate(cfg.data, _convert_="all")
    datamodule.setup("fit")
    model = instantiate(cfg.model, n_tasks=len(datamodule.tasks), _convert_="all")
    trainer: pl.Trainer = instantiate(cfg.trainer, callbacks=_instantiate_dict(cfg.get("callbacks")),
                                      logger=_instantiate_dict(cfg.get("logger")) or False)
    if ckpt_path is not None:
        log.info("resuming the forecaster's fit from %s", ckpt_path)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    metrics = {"val_pinball": best_val_pinball(trainer)}
    if not trainer.is_global_zero:
        return StageResult("forecaster", metrics=metrics)
    best = getattr(trainer.checkpoint_callback, "best_model_path", "") if trainer.checkpoint_callback else ""
    if best and Path(best).is_file():
        model = ForecasterModule.load_from_checkpoint(best, weights_only=True, map_location="cpu")
        log.info("best epoch checkpoint: %s", best)
    # point choice and calibration on the validation windows (on the CPU, wherever training ran)
    obj = build_checkpoint(model, datamodule, select_point=cfg.select_point,
                           calibrate_quantiles=cfg.calibrate_quantiles)
    path = save_checkpoint(obj, out_dir / "dprobe.pt")
    export_onnx(obj, out_dir / "dprobe.onnx")  # for the sidecar: no torch needed
    return StageResult("forecaster", outputs={"checkpoint": str(path), "onnx": str(out_dir / "dprobe.onnx")},
                       metrics=metrics)


def evaluate_checkpoint(checkpoint: Path, out_dir: Path, datasets: list[str], cache_dir: str | None) -> dict:
    """Score the checkpoint beside every baseline on each of ``datasets``; write report.md/json. ``cache_dir``:
    model graphs and replays of the workloads a directory's workloads.csv names (``conf/evaluate/default.yaml``:
    :func:`run` calls its partial)."""
    from dprobe.data import load_series_dataset
    from dprobe.data.workloads import workload_graphs
    from dprobe.evaluation import EvalConfig, evaluate_dataset
    from dprobe.evaluation.report import markdown_table, plot_forecasts
    from dprobe.forecaster.loading import load_forecaster

    forecaster: Any = load_forecaster(str(checkpoint))  # a trained network's: it records its split
    reports, tables, plots = [], [], {}
    for directory in datasets:
        ds = load_series_dataset(directory)
        graphs = workload_graphs(directory, cache_dir=cache_dir)  # workloads.csv, if any
        # the test span of the split the checkpoint records: what it did not train on
        result = evaluate_dataset(ds, models={"dprobe": forecaster}, cfg=EvalConfig(split=forecaster.split),
                                  graphs=graphs)
        reports.append(result.to_json())
        tables.append(markdown_table(result))
        plots[f"forecasts-{ds.name}"] = str(out_dir / f"forecasts-{ds.name}.png")
        plot_forecasts(result, out_dir / f"forecasts-{ds.name}.png", methods=["last_value", "dprobe"],
                       lead_index=0 if ds.groups is not None else 1)  # a job's runs are seconds long
    (out_dir / "report.json").write_text(json.dumps(reports, indent=1))
    (out_dir / "report.md").write_text("\n".join(tables))
    print("\n".join(tables))
    return {"report": str(out_dir / "report.md"), "report_json": str(out_dir / "report.json"), "plots": plots,
            "rows": reports}


class _DropTips(logging.Filter):
    """Lightning's advertising tips (e.g. for a cloud logger), printed at every trainer start."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


_DROP_TIPS = _DropTips()


def data_dirs(cfg: DictConfig) -> dict[str, list[str]]:
    """The data directories of the enabled stages that :func:`check_profiles` does not load, by the config key
    that names them (``data.datasets``, ``kernel_gnn.data_dir``)."""
    dirs: dict[str, list[str]] = {}
    if cfg.forecaster_enabled:
        dirs["data.datasets"] = [str(d) for d in cfg.data.datasets]
    kernel_gnn = cfg.get("kernel_gnn")
    if kernel_gnn is not None and kernel_gnn.enabled and kernel_gnn.get("data_dir"):
        dirs["kernel_gnn.data_dir"] = [str(kernel_gnn.data_dir)]
    return dirs


def check_data(cfg: DictConfig) -> None:
    """Refuse, in one line (:class:`dprobe.data.DatasetError`), a run whose enabled stages read a data directory
    that is not there, naming the first such and where the data sets are looked for: at the start, before anything
    trains."""
    from dprobe.data.common import DatasetError
    from dprobe.data.registry import WHERE_DATA_GOES

    for key, dirs in data_dirs(cfg).items():
        for directory in dirs:
            if not Path(directory).is_dir():
                raise DatasetError(f"no training data: {directory} ({key}) is not a directory; {WHERE_DATA_GOES}")


def check_profiles(cfg: DictConfig) -> None:
    """Load each h200-profiles directory an enabled stage reads, so that a wrong path fails at the start,
    not after the forecaster's minutes of training."""
    from dprobe.data import load_h200_profiles

    for name in ("coldstart", "jobscale"):
        if cfg[name].enabled:
            load_h200_profiles(cfg[name].data_dir)


def train_profilers(cfg: DictConfig, out_dir: Path, workers: int | None = None,
                    progress: bool = True) -> ProfilerResults:
    """The two h200-profiles models: the cold-start profiler, then the job-scale model (which reads the
    profiler's leave-family-out utilisation); ``workers``: processes for their replays and folds (default
    ``coldstart.workers`` and ``jobscale.workers``)."""
    cache = out_dir / "cache"  # model graphs and replays, shared by the two models
    bound = {"workers": workers} if workers else {}
    summary: dict = {}
    tables: list[str] = []
    stages: list[StageResult] = []
    cs: dict = {}
    if cfg.coldstart.enabled:
        start = time.perf_counter()
        cs = stage(cfg.coldstart)(out_dir=str(out_dir / "coldstart"), cache_dir=cache, progress=progress, **bound)
        stages.append(StageResult("coldstart", outputs=_paths(cs, "checkpoint", "plot"),
                                  metrics=cs.get("metrics", {}), seconds=time.perf_counter() - start))
        tables.append(cs["table"])
        summary["coldstart_checkpoint"] = str(cs["checkpoint"])
        summary["coldstart_metrics"] = cs.get("metrics", {})
        summary["coldstart_plot"] = cs.get("plot")
    else:
        stages.append(StageResult("coldstart", skipped="coldstart.enabled=false"))
    if cfg.jobscale.enabled:
        # the cold-start profiler's leave-family-out predictions, where it scored the same runs
        same_runs = cfg.coldstart.data_dir == cfg.jobscale.data_dir
        start = time.perf_counter()
        js = stage(cfg.jobscale)(out_dir=str(out_dir / "jobscale"), cache_dir=cache, progress=progress,
                                 coldstart_util=cs.get("cv_util") if same_runs else None, **bound)
        stages.append(StageResult("jobscale", outputs=_paths(js, "checkpoint", "report", "plot", "predictions"),
                                  metrics=js.get("metrics", {}), seconds=time.perf_counter() - start))
        tables.append(js["table"])
        summary["jobscale_checkpoint"] = js["checkpoint"]
        summary["jobscale_report"] = js["report"]
        summary["jobscale_plot"] = js.get("plot")
        summary["jobscale_predictions"] = js.get("predictions")
    else:
        stages.append(StageResult("jobscale", skipped="jobscale.enabled=false"))
    return ProfilerResults(stages, summary, tables)


PROFILERS_NICENESS = 10  # beside the forecaster, the profilers take the CPU time its threads leave


def _train_profilers_here(cfg: dict, out_dir: str, workers: int) -> ProfilerResults:
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


def job_series_report(summary: dict, cfg: DictConfig, out_dir: Path) -> tuple[str | None, StageResult]:
    """Where the forecaster trained on a data set of whole jobs (h200-profiles), its leave-family-out scores
    there beside persistence, its unknown-workload embedding and the job-scale model trained in the same run
    (:func:`dprobe.evaluation.jobs.job_report`), written to ``jobs.md`` (None where it did not), and the stage's
    result."""
    from dprobe.data.registry import detect_dataset
    from dprobe.evaluation.jobs import job_report
    from dprobe.forecaster.loading import load_forecaster

    if "checkpoint" not in summary:
        return None, StageResult("job_series", skipped="no forecaster checkpoint")
    start = time.perf_counter()
    for directory in cfg.data.datasets:
        if detect_dataset(directory) == "h200-profiles":
            text, scores = job_report(load_forecaster(summary["checkpoint"]), directory,
                                      summary.get("jobscale_predictions"), cfg.data.workload_cache,
                                      "graph" if cfg.jobscale.use_graph else "no_graph")
            (out_dir / "jobs.md").write_text(text)
            summary["job_series"] = {"report": str(out_dir / "jobs.md"), "targets": scores["targets"]}
            return text, StageResult("job_series", outputs={"report": str(out_dir / "jobs.md")},
                                     metrics={"targets": scores["targets"]}, seconds=time.perf_counter() - start)
    return None, StageResult("job_series", skipped="no h200-profiles data set in data.datasets")


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
    """Train what the config enables; returns where the checkpoints and reports went (``summary.json``), and
    ``val_pinball``, the metric that ``python train.py -m`` sweeps minimise (train.py's main returns it): the
    forecaster's validation pinball loss (:func:`best_val_pinball`; None when the forecaster is not trained).
    Each stage's :class:`StageResult` is logged as it ends and all are written to ``stages.json``.

    The forecaster and the two h200-profiles models are independent: with ``parallel_stages`` (and at
    least two cores) the latter train in a second process from the start (:func:`side_by_side`)."""
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")  # a library-internal deprecation, once a step
    logging.getLogger("pytorch_lightning.utilities.rank_zero").addFilter(_DROP_TIPS)  # once: same object
    check_data(cfg)
    pl.seed_everything(cfg.seed, workers=True)
    out_dir = Path(cfg.paths.output_dir)
    summary: dict = {"output_dir": str(out_dir), "val_pinball": None}
    if not started_as_rank_zero():  # a DDP worker that a launcher started: it fits, rank zero does everything else
        if cfg.forecaster_enabled:
            summary["val_pinball"] = train_forecaster(cfg, out_dir).metrics["val_pinball"]
        return summary
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    check_profiles(cfg)
    if cfg.forecaster_enabled:
        resume_checkpoint(cfg)  # a checkpoint to resume from that is not there: refused before anything trains
    stages: list[StageResult] = []

    def done(result: StageResult) -> StageResult:
        result.seconds = round(result.seconds, 3)
        stages.append(result)
        log.info(result.line())
        return result

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
            start = time.perf_counter()
            fitted = train_forecaster(cfg, out_dir)
            fitted.seconds = time.perf_counter() - start
            summary["val_pinball"] = fitted.metrics["val_pinball"]
            if "checkpoint" not in fitted.outputs:  # not rank zero after all (the trainer knows best): no more
                if profilers is not None:
                    profilers.stop()
                return summary
            done(fitted)
            checkpoint = Path(fitted.outputs["checkpoint"])
            summary["checkpoint"] = str(checkpoint)
            if cfg.evaluate.enabled:
                start = time.perf_counter()
                evaluated = stage(cfg.evaluate)(checkpoint=checkpoint, out_dir=out_dir)
                done(StageResult("evaluate", outputs={**_paths(evaluated, "report", "report_json"),
                                                      **evaluated.get("plots", {})},
                                 seconds=time.perf_counter() - start))
                summary["evaluation"] = evaluated["report"]
            else:
                done(StageResult("evaluate", skipped="evaluate.enabled=false"))
        else:
            done(StageResult("forecaster", skipped="forecaster_enabled=false"))
            done(StageResult("evaluate", skipped="no forecaster checkpoint (forecaster_enabled=false)"))
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
    if profiled is None:  # bars on a terminal; a log written to a file gets the stages' lines
        profiled = train_profilers(cfg, out_dir, progress=sys.stderr.isatty())
    for result in profiled.stages:
        done(result)
    if profiled.tables:
        print("\n".join(profiled.tables))
    summary.update(profiled.summary)
    jobs, job_stage = job_series_report(summary, cfg, out_dir)
    done(job_stage)
    if jobs:
        print(jobs)
    if cfg.get("kernel_gnn") is not None and cfg.kernel_gnn.enabled:  # +exp=gnn: conf/kernel_gnn/default.yaml
        start = time.perf_counter()
        fitted = stage(cfg.kernel_gnn)(out_dir=str(out_dir / "kernel_gnn"))
        done(StageResult("kernel_gnn", outputs=_paths(fitted, "checkpoint", "report"),
                         metrics={k: fitted[k] for k in ("gnn_mape", "vector_mape", "rule_mape")},
                         seconds=time.perf_counter() - start))
        summary["kernel_gnn"] = fitted["checkpoint"]
    else:
        done(StageResult("kernel_gnn", skipped="kernel_gnn.enabled=false"))
    if cfg.get("pretrain") is not None and cfg.pretrain.enabled:  # +exp=pretrain_gnn: conf/pretrain/gnn.yaml
        start = time.perf_counter()
        pretrained = stage(cfg.pretrain)(out_dir=str(out_dir / "pretrain_gnn"))
        done(StageResult("pretrain", outputs=_paths(pretrained, "checkpoint"),
                         metrics={k: pretrained[k] for k in ("best_conv", "architectures", "families")
                                  if k in pretrained}, seconds=time.perf_counter() - start))
        summary["graph_encoder"] = pretrained["checkpoint"]
    else:
        done(StageResult("pretrain", skipped="pretrain.enabled=false" if cfg.get("pretrain") is not None
                         else "no pretrain group (+exp=pretrain_gnn adds it)"))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    write_stages(stages, out_dir / "stages.json")
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
