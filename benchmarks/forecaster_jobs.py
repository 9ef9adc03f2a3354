"""The forecaster on whole jobs it never saw: h200-profiles' training runs of the model families its split
leaves for testing, forecast 1, 5 and 10 s ahead from each run's first second on.

Side by side, in the same run: the forecaster given each run's model graph; the same forecaster told
nothing of the workload (its "unknown workload" embedding); persistence (the last value, quantiles from
the training families' errors); and, from the first second, the job-scale model's leave-family-out
predictions (each run predicted by a fold that never saw its family). Targets: pinball at 5 and 10 s at
least 15 % below the unknown-workload embedding and 30 % below persistence; the memory plateau's MAPE
no worse than the job-scale model's.

    .venv/bin/python benchmarks/forecaster_jobs.py --checkpoint outputs/RUN/dprobe.pt
        [--data datasets/h200-profiles] [--jobscale-predictions OUT/jobscale/lofo.csv] [--cache DIR] [--check]

A ``train.py +exp=jobs`` run prints the same table and writes it to its ``jobs.md``; its
``jobscale/lofo.csv`` is what ``--jobscale-predictions`` takes. Without it the job-scale model is
cross-validated here (leave-family-out in 20 groups, the cold-start profiler's utilisation with it:
several minutes on two cores).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def jobscale_predictions(data: str, cache: str, out: Path) -> Path:
    """Cross-validate the job-scale model (graph variant, as ``+exp=gnn`` trains it) and write its
    leave-family-out predictions."""
    from dprobe.profiling.jobscale.data import load_job_dataset
    from dprobe.profiling.jobscale.train import cross_validate_predictions, write_predictions

    ds = load_job_dataset(data, cache, with_graphs=True, folds=20)
    preds = cross_validate_predictions(ds, folds=20, workers=None)
    return write_predictions(ds, preds, out / "lofo.csv")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True,
                        help="forecaster to score: the dprobe.pt or dprobe.onnx of a `train.py +exp=jobs` run")
    parser.add_argument("--data", default=str(ROOT / "datasets" / "h200-profiles"), help="h200-profiles layout")
    parser.add_argument("--jobscale-predictions", help="a job-scale training's lofo.csv (default: computed here)")
    parser.add_argument("--cache", default=str(ROOT / ".cache" / "coldstart"),
                        help="model graphs and replays, kept between runs")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)

    from dprobe.evaluation.jobs import job_report
    from dprobe.forecaster.loading import load_forecaster

    forecaster = load_forecaster(args.checkpoint)
    if not any(t.dataset == "h200-profiles" for t in forecaster.tasks):
        print(f"{args.checkpoint} was not trained on job series (no h200-profiles task): train one with "
              "`python train.py +exp=jobs`", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        predictions = args.jobscale_predictions or str(jobscale_predictions(args.data, args.cache, Path(tmp)))
        text, scores = job_report(forecaster, args.data, predictions, args.cache)
    print(text)
    missed = [line for line in scores["targets"] if line.endswith("MISSED")]
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
