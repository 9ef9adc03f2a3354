"""Forecaster inference latency on one CPU core: one target, and 1,000 targets in one batch.

Targets: one target <= 5 ms, 1,000 targets batched <= 0.5 s. Latency does not
depend on the weights, so without ``--checkpoint`` a model with the default
config's architecture (untrained) is timed. The last-value and EWMA baselines
are timed on the same inputs for comparison.

    python benchmarks/forecaster_inference.py [--checkpoint outputs/.../dprobe.pt]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def default_checkpoint(path: Path) -> Path:
    from dprobe.config import compose
    from dprobe.forecaster.checkpoint import export_checkpoint
    from dprobe.forecaster.module import ForecasterModule
    from dprobe.forecaster.tasks import TaskSpec

    cfg = compose()
    hp = {k: v for k, v in cfg.model.items() if k != "_target_"}
    module = ForecasterModule(n_tasks=3, **hp)
    tasks = [TaskSpec("gpu_duty_cycle_pct", "alibaba-genai-2026", (5, 15, 30), 57.0, ("qps", "qps_api"), 4.0),
             TaskSpec("gpu_memory_bytes", "alibaba-genai-2026", (5, 15, 30), 57.0, ("qps", "qps_api"), 1e10),
             TaskSpec("gpu_demand", "helios-earth-vc", (6, 12, 24), 300.0, (), 10.0)]
    return export_checkpoint(module, tasks, path)


def timed(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", help="a trained dprobe.pt (default: untrained default architecture)")
    parser.add_argument("--repeats", type=int, default=50, help="timed calls of one target (a tenth as many of the batch); median and p99 reported")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from dprobe.forecaster import ForecastInput, make_baseline
    from dprobe.forecaster.loading import load_forecaster, read_checkpoint
    from dprobe.forecaster.onnx_export import export_onnx

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.checkpoint or default_checkpoint(Path(tmp) / "dprobe.pt")
        model = load_forecaster(str(ckpt))
        onnx_model = load_forecaster(str(export_onnx(read_checkpoint(ckpt), Path(tmp) / "dprobe.onnx")))
    rng = np.random.default_rng(0)
    length = model.context_length
    one = ForecastInput(values=rng.random((1, length)) * 1e10, metric="gpu_memory_bytes", leads=(5, 15, 30),
                        step_seconds=57.0)
    many = ForecastInput(values=rng.random((1000, length)) * 1e10, metric="gpu_memory_bytes",
                         leads=(5, 15, 30), step_seconds=57.0)
    rows = [("dprobe", model), ("dprobe-onnx", onnx_model)] + [(n, make_baseline(n)) for n in ("last_value", "ewma")]
    print(f"context {length} steps, 3 leads, 3 quantiles, torch threads = {torch.get_num_threads()}")
    print(f"{'method':<12} {'1 target p50':>14} {'1 target p99':>14} {'1000 targets p50':>18}")
    results = {}
    for name, f in rows:
        t1 = timed(lambda f=f: f.predict(one), args.repeats)
        tn = timed(lambda f=f: f.predict(many), max(5, args.repeats // 10))
        results[name] = (statistics.median(t1), float(np.percentile(t1, 99)), statistics.median(tn))
        print(f"{name:<12} {results[name][0] * 1e3:>11.2f} ms {results[name][1] * 1e3:>11.2f} ms "
              f"{results[name][2] * 1e3:>15.1f} ms")
    one_ms, _, many_s = results["dprobe"][0] * 1e3, None, results["dprobe"][2]
    print("(dprobe: torch; dprobe-onnx: the same network exported to ONNX, as the sidecar runs it)")
    print(f"\ntarget: one target <= 5 ms: {one_ms:.2f} ms -> {'PASS' if one_ms <= 5 else 'over'}")
    print(f"target: 1,000 targets <= 0.5 s: {many_s:.3f} s -> {'PASS' if many_s <= 0.5 else 'over'}")
    print(f"ratio to the EWMA baseline (1000 targets): {many_s / results['ewma'][2]:.1f}x")


if __name__ == "__main__":
    main()
