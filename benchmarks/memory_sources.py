"""Memory on a GPU or stack never measured: each source's factor on dprobe's predicted memory, the factors
for an unseen stack, and how each source would have fared left out (dprobe.profiling.coldstart.memory_sources).

Sources:
- h200-profiles: the runs the cold-start model learnt its memory from (factor 1 by construction);
- timm-train-rtx3090: the factor the shipped checkpoint learnt from timm's fit / ran-out-of-memory labels
  on an RTX 3090 (PyTorch 1.12; ``memory_factors`` of default_coldstart.pt);
- gavel-colocation: the factor that gets most of Gavel's pair labels right (a pair ran together or did
  not: both jobs' predicted allocator peaks times the factor plus a CUDA context each, against the GPU's
  memory; K80, P100, V100; a 2019 stack).

Each source left out in turn: the geometric mean of the others' factors (the unseen p50), the p90 the
others' spread gives, and whether the left-out source's factor lies under it.

    .venv/bin/python benchmarks/memory_sources.py [--write] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def gavel_source():
    from dprobe.profiling.coldstart.memory_sources import MemorySource, fit_label_factor
    from dprobe.sharing.gavel import unordered_pairs
    from dprobe.sharing.interference import CUDA_CONTEXT_BYTES
    from dprobe.sharing.interference_fit import gavel_jobs

    jobs = gavel_jobs()
    pairs = unordered_pairs(jobs.pairs)
    need, capacity = [], []
    for r in pairs.itertuples():
        a, b, gpu = jobs.pair(r)
        need.append(a["peak_memory_bytes"]["p50"] + b["peak_memory_bytes"]["p50"])
        capacity.append(gpu.memory_bytes)
    factor, right = fit_label_factor(np.array(need), np.array(capacity), pairs["measured"].to_numpy(),
                                     fixed=2 * CUDA_CONTEXT_BYTES)
    names = sorted({jobs.gpu(g).name for g in pairs["gpu"]})
    return MemorySource("gavel-colocation", tuple(names), "PyTorch of 2019 (Gavel), fp32", round(factor, 4),
                        "fit labels", len(pairs)), right


def sources():
    import torch

    from dprobe.data import load_h200_profiles
    from dprobe.profiling.coldstart.memory_sources import MemorySource
    from dprobe.profiling.coldstart.predict import DEFAULT_CHECKPOINT
    from dprobe.profiling.coldstart.timm_bench import load_timm_bench

    ckpt = torch.load(DEFAULT_CHECKPOINT, weights_only=True)
    runs = load_h200_profiles(ROOT / "datasets" / "h200-profiles").train_runs()
    timm = load_timm_bench(ROOT / "datasets" / "timm-train-rtx3090")
    gavel, right = gavel_source()
    return [MemorySource("h200-profiles", ("h200",), "h200-profiles (PyTorch 2.x, the runs' own)", 1.0, "measured",
                         len(runs)),
            MemorySource("timm-train-rtx3090", ("rtx3090",), "timm-2022 (PyTorch 1.12, CUDA 11.3)",
                         float(ckpt["memory_factors"]["rtx3090"]), "fit labels", len(timm.runs)),
            gavel], right


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="write dprobe/profiling/coldstart/memory_sources.json")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from dprobe.profiling.coldstart.memory_sources import SOURCES_PATH, unseen_memory, write_sources

    found, gavel_right = sources()
    u = unseen_memory(found)
    if args.write:
        write_sources(found)
        print(f"wrote {SOURCES_PATH}", file=sys.stderr)
    if args.json:
        print(json.dumps({"sources": [s.__dict__ for s in found], "p50_factor": u.p50_factor,
                          "p90_factor": u.p90_factor, "left_out": list(u.left_out)}))
        return 0
    print("| source | GPUs | stack | evidence | rows | factor |")
    print("| --- | --- | --- | --- | ---: | ---: |")
    for s in found:
        print(f"| {s.name} | {', '.join(s.gpus)} | {s.stack} | {s.evidence} | {s.rows} | {s.factor:.3f} |")
    print(f"\n(gavel-colocation's factor gets {100 * gavel_right:.1f} % of its pair labels right)")
    print(f"\nunseen GPU / stack: p50 x{u.p50_factor:.3f}, p90 x{u.p50_factor * u.p90_factor:.3f} on the model's own")
    print("\n| left out | its factor | the others' p50 factor | error | the others' p90 factor | covered |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for r in u.left_out:
        print(f"| {r['source']} | {r['factor']:.3f} | {r['others_factor']:.3f} | {100 * (np.exp(r['log_error']) - 1):+.1f} % "
              f"| {r['others_p90_factor']:.3f} | {'yes' if r['covered'] else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
