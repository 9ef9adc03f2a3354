"""``dprobe evaluate``: score a checkpoint and the baselines on a directory of series."""

from __future__ import annotations

import argparse
import json
import sys

from dprobe.core.names import BASELINES
from dprobe.core.split import Split


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="score forecasts against the baselines on a data directory",
        description="Rolling-origin evaluation over the last part of each series (--test-fraction, 30 % by "
        "default: what training leaves out) at the data set's lead "
        "times (alibaba-genai-2026: 5/15/30 steps of 57 s; helios-earth-vc: 30/60/120 min). Every "
        "baseline runs, and the model's rows are added as method 'dprobe': the forecaster shipped with dprobe, "
        "or --checkpoint. DIR is laid out like one of the bundled data sets (same file names and columns; any "
        "pods or VCs). A checkpoint is not scored on a span it was trained or calibrated on (its recorded "
        "split) unless --allow-train-overlap. An h200-profiles directory is scored as whole jobs: the runs of "
        "the model families its split leaves for testing (--test-fraction: the share of families), from each "
        "run's first second on, 1/5/10 s ahead, against persistence and the model without its graphs.",
    )
    p.add_argument("--data", required=True, metavar="DIR", help="data directory, e.g. datasets/helios-earth-vc")
    p.add_argument("--checkpoint", metavar="CKPT",
                   help="the trained forecaster to score beside the baselines (dprobe.pt or dprobe.onnx of python "
                        "train.py; default, or 'dprobe': the one shipped with dprobe; none: the baselines alone)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a Markdown table")
    p.add_argument("--plot", metavar="FILE.png", help="also draw forecasts against actuals for a few series")
    p.add_argument("--baselines", default=",".join(BASELINES),
                   help="comma-separated baselines to run (default: all of them: %(default)s)")
    p.add_argument("--test-fraction", type=float,
                   help=f"share of each series used as test span (default: {Split().test_fraction:g}); a "
                        "checkpoint's own training and validation spans must end before it")
    p.add_argument("--allow-train-overlap", action="store_true",
                   help="score the checkpoint even where the test span reaches into the part of the series it was "
                        "trained or calibrated on (its figures there are not out of sample)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dprobe.core.plots import check_plot_path
    from dprobe.data import load_series_dataset
    from dprobe.evaluation.harness import EvalConfig, evaluate_dataset, train_overlap
    from dprobe.evaluation.report import markdown_table, plot_forecasts

    split = Split()
    if args.test_fraction is not None:
        if not 0 < args.test_fraction < 1:
            raise ValueError(f"--test-fraction must be between 0 and 1, got {args.test_fraction}")
        split = split.with_test_fraction(args.test_fraction)
    baselines = [b.strip() for b in args.baselines.split(",") if b.strip()]
    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        raise ValueError(f"unknown baseline(s) {', '.join(unknown)}; choose from {', '.join(BASELINES)}")
    if not baselines and (args.checkpoint or "").lower() == "none":
        raise ValueError(f"nothing to score: no --baselines and --checkpoint none; choose from {', '.join(BASELINES)}")
    if args.plot:  # refused now rather than after the evaluation
        check_plot_path(args.plot)
    models = {}
    if (args.checkpoint or "").lower() != "none":  # loaded first: a bad checkpoint is refused before the data is read
        from dprobe.forecaster.loading import SHIPPED_FORECASTER, checkpoint_path, load_forecaster

        checkpoint = checkpoint_path(args.checkpoint) or SHIPPED_FORECASTER
        models["dprobe"] = load_forecaster(checkpoint)
        trained: Split | None = getattr(models["dprobe"], "split", None)  # the split its checkpoint records
        overlap = train_overlap(models["dprobe"], split)
        if overlap and trained is not None and not args.allow_train_overlap:
            raise ValueError(f"{checkpoint} {overlap}: pass --test-fraction {trained.test_fraction:g} "
                             "or less to score it on what it has not seen, or --allow-train-overlap to score it "
                             "there anyway")
        if checkpoint == SHIPPED_FORECASTER:
            print(f"scoring the forecaster shipped with dprobe ({SHIPPED_FORECASTER.name}) as 'dprobe'; "
                  "--checkpoint CKPT scores yours", file=sys.stderr)
    ds = load_series_dataset(args.data)
    cfg = EvalConfig(split=split, baselines=baselines,
                     progress=not args.no_progress and sys.stderr.isatty())
    graphs = None
    if models:  # series a workloads.csv names are forecast with their model graph
        from dprobe.data.workloads import workload_graphs

        if ds.groups is not None:  # whole jobs: only the test families' runs are forecast
            from dprobe.evaluation.jobs import held_out_runs

            graphs = workload_graphs(args.data, held_out_runs(ds, split))
        else:
            graphs = workload_graphs(args.data)
    result = evaluate_dataset(ds, models=models, cfg=cfg, graphs=graphs)
    if not result.rows:
        raise ValueError(f"{args.data}: no series long enough to evaluate (need {cfg.min_length} points)")
    if args.json:
        json.dump(result.to_json(), sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(markdown_table(result))
    if args.plot:
        path = plot_forecasts(result, args.plot, methods=["last_value", "ets", *models][-3:],
                              lead_index=0 if ds.groups is not None else 1)  # a job's runs are seconds long
        print(f"plot written to {path}", file=sys.stderr)
    return 0
