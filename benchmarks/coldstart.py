"""Leave-model-family-out benchmark of the cold-start predictor on h200-profiles.

    .venv/bin/python benchmarks/coldstart.py [--data datasets/h200-profiles] [--epochs 400] [--cache DIR]
                                             [--plot lofo.png] [--folds K]
    .venv/bin/python benchmarks/coldstart.py --families 9,12,15 [--draws 3] [--ensemble 3]

``--families``: how the errors fall with more training families (each family scored by models
fitted on K of the others, drawn at random, ``--draws`` times), to judge what profiling more
architectures would bring.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dprobe.data import load_h200_profiles
from dprobe.profiling.coldstart.crossval import cross_validate, metrics
from dprobe.profiling.coldstart.report import ROWS, format_scores, host_factor_note


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="datasets/h200-profiles",
                    help="a directory laid out like h200-profiles (default: %(default)s)")
    ap.add_argument("--epochs", type=int, default=400, help="training epochs of each member (default: %(default)s)")
    ap.add_argument("--cache", default=".cache/coldstart",
                    help="where replays and graphs are cached (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="first member's seed (default: %(default)s)")
    ap.add_argument("--plot", metavar="PNG", help="also draw predicted against measured, run by run")
    ap.add_argument("--folds", type=int, default=None,
                    help="hold families out in K random groups (as train.py does) instead of one at a time")
    ap.add_argument("--families", metavar="K,K,...",
                    help="instead: the learning curve, training on K of the other families for each K")
    ap.add_argument("--draws", type=int, default=3, help="random draws of families per K (default: %(default)s)")
    ap.add_argument("--workers", type=int, default=None,
                    help="processes for the replays and the folds (default: one per CPU core, at most 4; 1: none)")
    ap.add_argument("--ensemble", type=int, default=None,
                    help="members per model (default: the training default; 3 makes --families quicker)")
    args = ap.parse_args()
    hp = {"ensemble": args.ensemble} if args.ensemble else {}
    if args.families:
        learning_curve(args, [int(k) for k in args.families.split(",")], hp)
        return
    t0 = time.time()
    cv = cross_validate(args.data, args.cache, max_epochs=args.epochs, seed=args.seed, folds=args.folds,
                        workers=args.workers, **hp)
    print(f"leave-model-family-out on {args.data}: {cv.runs} runs, {cv.families} families in "
          f"{cv.folds} folds ({time.time() - t0:.0f} s)")
    table, missed = format_scores(cv.learned, cv.analytical, cv.typical_machine)
    print(table)
    print(host_factor_note(cv))
    ds = cv.dataset
    for reason in ds.skipped:
        print(f"left out: {reason}")
    machines = np.array(ds.machines)
    for m in sorted(set(machines)):  # each machine's runs on their own
        on = machines == m
        s = metrics(ds.y[on], cv.p50[on], cv.p90[on], ds.valid[on])
        print(f"  {m}: {on.sum()} runs: peak {s['peak_mape']:.2f} %, NVML {s['nvml_mape']:.2f} %, "
              f"util {s['util_mae_points']:.2f} points, step {s['step_mape']:.2f} %")
    # NVML memory and utilisation are scored while the measured steps ran; runs.csv's columns cover the
    # whole run, setup before the steps included (collection 1: FLOP counting, cuDNN autotuning)
    runs = load_h200_profiles(args.data).train_runs()
    runs = runs.set_index(runs["run_id"].astype(str)).loc[ds.run_ids]  # the runs scored, in their order
    peak, util = runs["nvml_peak_used_bytes"].to_numpy(), runs["nvml_gpu_util_pct_mean_2nd_half"].to_numpy() / 100
    print(f"{'  NVML MAPE vs whole-run peak':34s} {100 * np.mean(np.abs(cv.p50[:, 1] / peak - 1)):10.3f} "
          f"{100 * np.mean(np.abs(ds.base[:, 1] / peak - 1)):11.3f}   (runs.csv's columns)")
    print(f"{'  util MAE vs whole-run 2nd half':34s} {100 * np.mean(np.abs(cv.p50[:, 2] - util)):10.3f} "
          f"{100 * np.mean(np.abs(ds.base[:, 2] - util)):11.3f}")
    print(f"{'PASS' if not missed else 'MISS'}: {len(ROWS) - len(missed)} of {len(ROWS)} targets met"
          + (f" (missed: {', '.join(missed)})" if missed else ""))
    if args.plot:
        from dprobe.profiling.coldstart.report import plot_cross_validation

        print(f"plot: {plot_cross_validation(cv, args.plot)}")
    print("\nper run (family, run, measured peak GB, learned APE %, analytical APE %):")
    for i, rid in enumerate(ds.run_ids):
        y = ds.y[i, 0]
        print(f"  {ds.families[i]:12s} {rid} {ds.models[i]:20s} b={int(ds.batch[i]):4d} {y / 1e9:7.2f} "
              f"{100 * abs(cv.p50[i, 0] - y) / y:6.2f} {100 * abs(ds.base[i, 0] - y) / y:6.2f}")


def learning_curve(args: argparse.Namespace, sizes: list[int], hp: dict) -> None:
    """Leave-family-out errors when training on K of the other families, mean over the draws."""
    from dprobe.profiling.coldstart.dataset import load_dataset

    ds = load_dataset(args.data, args.cache, workers=args.workers)
    keys = [("peak_mape", "peak MAPE %"), ("nvml_mape", "NVML MAPE %"), ("util_mae_points", "util MAE pts"),
            ("step_mape", "step MAPE %"), ("step_spearman", "step Spearman")]
    print(f"{'training families':>17s} " + " ".join(f"{label:>13s}" for _, label in keys))
    for k in sizes:
        runs = [cross_validate(args.data, args.cache, max_epochs=args.epochs, seed=args.seed + d, ds=ds,
                               train_families=k, progress=False, calibrate=False, workers=args.workers,
                               **hp).learned for d in range(args.draws)]
        # the median: a draw that leaves too narrow a set of families to extrapolate from can explode
        print(f"{k:17d} " + " ".join(f"{np.median([r[key] for r in runs]):13.3f}" for key, _ in keys)
              + f"   (median of {args.draws} draws)")


if __name__ == "__main__":
    main()
