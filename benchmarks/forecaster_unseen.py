"""How the forecaster does on series it never saw: train on some pods / VCs, score on the others.

Splits each bundled series data set by a hash of the series id (pods of alibaba-genai-2026, VCs of
helios-earth-vc) into a training directory and a held-out directory laid out exactly like the
original, trains the forecaster on the training directories only (the default config, or with
``--quick`` a shorter run), and scores it with the evaluation harness beside every baseline on the
held-out series. Prints, per target and lead, the model's MAE and pinball loss against the best
baseline's, their ratio, and the model's p90 and p99 coverage.

    python benchmarks/forecaster_unseen.py [--holdout 0.25] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "datasets"


def _held_out(uid: str, share: float) -> bool:
    return int(hashlib.sha256(uid.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def split_alibaba(share: float, train: Path, test: Path) -> None:
    src = DATA / "alibaba-genai-2026"
    for name in ("pod_gpu_duty_cycle_anon", "pod_gpu_memory_used_bytes_anon", "qps"):
        df = pd.read_csv(src / f"{name}.csv.gz")
        held = df["container_ip"].astype(str).map(lambda u: _held_out(u, share))
        shared = df["container_ip"].isna()  # cluster-wide API request rate goes to both
        df[~held | shared].to_csv(train / f"{name}.csv.gz", index=False)
        df[held | shared].to_csv(test / f"{name}.csv.gz", index=False)


def split_helios(share: float, train: Path, test: Path) -> None:
    src = DATA / "helios-earth-vc"
    files = sorted(src.glob("vc*.csv.gz"))
    held = [f for f in files if _held_out(f.name.split(".")[0], share)] or files[:1]
    for f in files:
        shutil.copy(f, (test if f in held else train) / f.name)
    for d in (train, test):
        shutil.copy(src / "Earth_gpu_number.csv", d / "Earth_gpu_number.csv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--holdout", type=float, default=0.25, help="share of series held out")
    parser.add_argument("--quick", action="store_true", help="shorter training (for a smoke run)")
    parser.add_argument("--out", help="keep the run's outputs here (default: a temporary directory)")
    args = parser.parse_args()

    from dprobe.config import compose
    from dprobe.evaluation.scoring import against_baselines
    from dprobe.training import run

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.out or tmp)
        dirs = {}
        for name, split in (("alibaba-genai-2026", split_alibaba), ("helios-earth-vc", split_helios)):
            train, test = base / "train" / name, base / "heldout" / name
            train.mkdir(parents=True, exist_ok=True)
            test.mkdir(parents=True, exist_ok=True)
            split(args.holdout, train, test)
            dirs[name] = (train, test)
        train_list = ",".join(str(t) for t, _ in dirs.values())
        test_list = ",".join(str(t) for _, t in dirs.values())
        overrides = [f"paths.output_dir={base / 'run'}", f"data.datasets=[{train_list}]",
                     f"evaluate.datasets=[{test_list}]", "trainer.enable_progress_bar=false"]
        if args.quick:
            overrides += ["trainer.max_epochs=2", "data.samples_per_epoch=4000"]
        run(compose(overrides))
        reports = json.loads((base / "run" / "report.json").read_text())
        print("\nHeld-out series (never seen in training): dprobe against the best baseline")
        print(f"{'dataset':<20} {'target':<20} {'lead':>4} {'MAE ratio':>9} {'pinball ratio':>13} "
              f"{'p90 cov':>8} {'p99 cov':>8}")
        for rep in reports:
            for r in against_baselines(rep["rows"]):
                print(f"{rep['dataset']:<20} {r['target']:<20} {r['lead_steps']:>4} {r['mae_ratio']:>9.2f} "
                      f"{r['pinball_ratio']:>13.2f} {r['coverage_p90']:>8.1%} {r['coverage_p99'] or float('nan'):>8.1%}")


if __name__ == "__main__":
    main()
