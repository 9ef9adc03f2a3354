"""Does the kernel model help the replay roofline on a GPU never seen? The inference step model
(``datasets/timm-infer-gpus``: RTX 3090, RTX 4090 on two stacks, RTX 5090; fp16 autocast) cross-validated
with its features on each replay roofline of
:data:`~dprobe.profiling.coldstart.features.ROOFLINES`, side by side:

- ``plain``: each kernel at max(FLOPs / peak, bytes / bandwidth) plus a launch cost;
- ``kernel-model``: kernels on the vector units (element-wise, norm) at their fp32 roofline times the
  shape-free kernel model's efficiency (learnt on NeuSight's fp32 calls), tensor-core kernels plain
  (what ships: :data:`~dprobe.profiling.coldstart.inference.SHIPPED_ROOFLINE`);
- ``kernel-model-all``: that fp32-learnt efficiency on the tensor-core roofline of matmuls and
  convolutions too.

    .venv/bin/python benchmarks/kernel_roofline.py [--data datasets/timm-infer-gpus] [--json]

Each GPU left out (all its stacks) and each fifth of the timm modules (families) left out, through
:func:`dprobe.profiling.coldstart.inference.crossval` (``roofline=``), the path ``predict_inference_step``
takes: the raw roofline, the rule (roofline x the fitting rows' median measured / roofline) and the
learned model, MAPE per fold and the mean over folds. The ship rule: the kernel-model roofline replaces the
plain one if its mean MAPE over GPUs left out is lower (for the shipped method) and its mean over family
folds is not worse by more than the noise (NOISE_PP points). About 2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dprobe.profiling.coldstart.features import ROOFLINES  # noqa: E402
from dprobe.profiling.coldstart.inference import crossval, default_model, load_rows  # noqa: E402

KINDS = ("roofline", "rule", "model")
NOISE_PP = 0.5  # MAPE points a family-fold mean may rise by and still count as not worse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(ROOT / "datasets" / "timm-infer-gpus"))
    p.add_argument("--rooflines", nargs="+", choices=ROOFLINES, default=list(ROOFLINES))
    p.add_argument("--json", action="store_true", help="print the folds as JSON")
    args = p.parse_args(argv)
    t0 = time.time()
    runs, ests = load_rows(args.data)
    folds = {}
    for roofline in args.rooflines:
        for by in ("gpu", "family"):
            t1 = time.time()
            folds[roofline, by] = crossval(runs, ests, by, roofline)
            if not args.json:
                print(f"{roofline:>16} {by:>6}: {time.time() - t1:4.0f} s", file=sys.stderr)
    if args.json:
        print(json.dumps({f"{r}/{by}": [asdict(f) for f in fs] for (r, by), fs in folds.items()}, indent=1))
        return 0
    mean = {key: {k: float(np.mean([getattr(f, k).mape for f in fs])) for k in KINDS} for key, fs in folds.items()}
    print(f"{len(runs)} rows ({runs['model'].nunique()} models, {runs['gpu'].nunique()} GPUs), "
          f"{time.time() - t0:.0f} s; MAPE % (raw roofline / rule / learned model)")
    for by in ("gpu", "family"):
        names = [f.fold for f in folds[args.rooflines[0], by]]
        print(f"\nleft out by {by}: " + " | ".join(f"{r:^22}" for r in args.rooflines))
        for i, name in enumerate(names):
            print(f"  {name:<12} " + " | ".join(
                " ".join(f"{getattr(folds[r, by][i], k).mape:6.1f}" for k in KINDS) for r in args.rooflines))
        print(f"  {'mean':<12} " + " | ".join(" ".join(f"{mean[r, by][k]:6.1f}" for k in KINDS)
                                             for r in args.rooflines))
    shipped = "model" if default_model().method == "learned" else "rule"
    print(f"\nship rule (the shipped method, {shipped}): a kernel-model roofline replaces plain where its mean "
          f"MAPE over GPUs left out is lower and over families not more than {NOISE_PP} points higher")
    for r in args.rooflines:
        if r == "plain" or "plain" not in args.rooflines:
            continue
        gpu_gain = mean["plain", "gpu"][shipped] - mean[r, "gpu"][shipped]
        fam_loss = mean[r, "family"][shipped] - mean["plain", "family"][shipped]
        ok = gpu_gain > 0 and fam_loss <= NOISE_PP
        print(f"  {r}: GPU left out {mean[r, 'gpu'][shipped]:.1f} % vs {mean['plain', 'gpu'][shipped]:.1f} %, "
              f"families {mean[r, 'family'][shipped]:.1f} % vs {mean['plain', 'family'][shipped]:.1f} % -> "
              f"{'ships' if ok else 'does not ship'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
