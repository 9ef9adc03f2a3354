"""What ``python train.py`` does: fit the forecaster, export its checkpoint, evaluate it, train the profiler."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


def _instantiate_dict(section: DictConfig | None) -> list:
    return [instantiate(c) for c in (section or {}).values() if c is not None and "_target_" in c]


def train_forecaster(cfg: DictConfig, out_dir: Path) -> Path:
    """Fit the forecaster on ``cfg.data`` and write the inference checkpoint ``dprobe.pt``."""
    from dprobe.forecasting.model import (
        checkpoint_dict,
        conformal_shifts,
        export_onnx,
        load_model_forecaster,
        save_checkpoint,
        select_point_sources,
        select_short_lead_exponents,
        validation_outputs,
    )
    from dprobe.models.lightning_module import ForecasterModule

    if cfg.trainer.get("accelerator") in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError("trainer=gpu needs a CUDA GPU, and torch sees none; trainer=default uses one when there "
                         "is one, trainer=cpu never")
    datamodule = instantiate(cfg.data, _convert_="all")
    datamodule.setup("fit")
    model = instantiate(cfg.model, n_tasks=len(datamodule.tasks), _convert_="all")
    trainer: pl.Trainer = instantiate(cfg.trainer, callbacks=_instantiate_dict(cfg.get("callbacks")),
                                      logger=_instantiate_dict(cfg.get("logger")) or False)
    trainer.fit(model, datamodule=datamodule)
    best = getattr(trainer.checkpoint_callback, "best_model_path", "") if trainer.checkpoint_callback else ""
    if best and Path(best).is_file():
        model = ForecasterModule.load_from_checkpoint(best, weights_only=True, map_location="cpu")
        log.info("best epoch checkpoint: %s", best)
    # point selection, calibration and export run on the CPU, wherever training ran (their batches are CPU
    # tensors, and a checkpoint must load on a machine without a GPU)
    model = model.cpu()
    outputs = validation_outputs(model, datamodule)  # one pass over the validation windows serves both
    sources = select_point_sources(model, datamodule, outputs=outputs) if cfg.get("select_point", True) else None
    if sources:
        log.info("point forecast per task and lead (chosen on validation): %s",
                 {t.name: s for t, s in zip(datamodule.task_specs, sources, strict=True)})
    shifts = (conformal_shifts(model, datamodule, sources, outputs=outputs) if cfg.get("calibrate_quantiles", True)
              else None)
    known = sum(int(t.known.sum()) for t in datamodule.tasks)
    if model.hparams.use_graph:
        log.info("workload conditioning: %d training series with a known workload%s", known,
                 "" if known else " (no workloads.csv: graphs given at inference will be ignored)")
    obj = checkpoint_dict(model, datamodule.task_specs, point_sources=sources, quantile_shifts=shifts,
                          workloads_trained=known > 0)
    # how the quantiles widen below the first lead, chosen with the forecaster as it will serve
    obj["short_lead_exponents"] = select_short_lead_exponents(load_model_forecaster(obj), datamodule)
    log.info("quantile spread below the first lead per task (1: linear, 0.5: square root): %s",
             {t.name: e for t, e in zip(datamodule.task_specs, obj["short_lead_exponents"], strict=True)})
    path = save_checkpoint(obj, out_dir / "dprobe.pt")
    export_onnx(obj, out_dir / "dprobe.onnx")  # for the sidecar: no torch needed
    return path


def evaluate_checkpoint(cfg: DictConfig, checkpoint: Path, out_dir: Path) -> dict:
    """Score the checkpoint beside every baseline on each evaluation directory; write report.md/json."""
    from dprobe.data import load_series_dataset
    from dprobe.data.workloads import workload_graphs
    from dprobe.evaluation import EvalConfig, evaluate_dataset
    from dprobe.evaluation.report import markdown_table, plot_forecasts
    from dprobe.forecasting.loading import load_forecaster

    forecaster = load_forecaster(str(checkpoint))
    reports, tables = [], []
    for directory in cfg.evaluate.datasets:
        ds = load_series_dataset(directory)
        graphs = workload_graphs(directory, cache_dir=cfg.data.get("workload_cache"))  # workloads.csv, if any
        result = evaluate_dataset(ds, models={"dprobe": forecaster},
                                  cfg=EvalConfig(test_fraction=cfg.evaluate.test_fraction), graphs=graphs)
        reports.append(result.to_json())
        tables.append(markdown_table(result))
        plot_forecasts(result, out_dir / f"forecasts-{ds.name}.png", methods=["last_value", "dprobe"])
    (out_dir / "report.json").write_text(json.dumps(reports, indent=1))
    (out_dir / "report.md").write_text("\n".join(tables))
    print("\n".join(tables))
    return {"report": str(out_dir / "report.md"), "rows": reports}


class _DropTips(logging.Filter):
    """Lightning's advertising tips (e.g. for a cloud logger), printed at every trainer start."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


_DROP_TIPS = _DropTips()


def run(cfg: DictConfig) -> dict:
    """Train what the config enables; returns where the checkpoints and reports went."""
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")  # a library-internal deprecation, once a step
    logging.getLogger("pytorch_lightning.utilities.rank_zero").addFilter(_DROP_TIPS)  # once: same object
    pl.seed_everything(cfg.seed, workers=True)
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    summary: dict = {"output_dir": str(out_dir)}
    if cfg.get("forecaster_enabled", True):
        checkpoint = train_forecaster(cfg, out_dir)
        summary["checkpoint"] = str(checkpoint)
        if cfg.evaluate.enabled:
            summary["evaluation"] = evaluate_checkpoint(cfg, checkpoint, out_dir)["report"]
    cache = out_dir / "cache"  # model graphs and replays, shared by the two h200-profiles models
    cs: dict = {}
    if cfg.coldstart.enabled:
        from dprobe.coldstart import train_coldstart

        cs = train_coldstart(str(cfg.coldstart.data_dir), str(out_dir / "coldstart"),
                             max_epochs=cfg.coldstart.max_epochs, seed=cfg.seed, cache_dir=cache,
                             folds=cfg.coldstart.get("folds"), workers=cfg.coldstart.get("workers"))
        print(cs["table"])
        summary["coldstart_checkpoint"] = str(cs["checkpoint"])
        summary["coldstart_metrics"] = cs.get("metrics", {})
        summary["coldstart_plot"] = cs.get("plot")
    if cfg.jobscale.enabled:
        from dprobe.jobscale import train_jobscale

        js = train_jobscale(str(cfg.jobscale.data_dir), str(out_dir / "jobscale"),
                            use_graph=cfg.jobscale.use_graph, epochs=cfg.jobscale.epochs, seed=cfg.seed,
                            graph_dim=cfg.jobscale.graph_dim, cache_dir=cache, folds=cfg.jobscale.get("folds"),
                            workers=cfg.jobscale.get("workers", 1),
                            # the cold-start profiler's leave-family-out predictions, where it scored the same runs
                            coldstart_util=cs.get("cv_util") if cfg.coldstart.data_dir == cfg.jobscale.data_dir
                            else None)
        print(js["table"])
        summary["jobscale_checkpoint"] = js["checkpoint"]
        summary["jobscale_report"] = js["report"]
        summary["jobscale_plot"] = js.get("plot")
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
