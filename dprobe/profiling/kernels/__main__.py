"""``python -m dprobe.profiling.kernels [DIR]``: fit the shipped kernel model on every GPU of a NeuSight
directory (default: the bundled ``datasets/neusight-kernels``) and write ``default_kernels.json``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from dprobe.profiling.kernels.data import load_device_specs, load_neusight
from dprobe.profiling.kernels.model import DEFAULT_MODEL, fit_shipped

BUNDLED = Path(__file__).resolve().parents[3] / "datasets" / "neusight-kernels"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dprobe.profiling.kernels", description=__doc__)
    parser.add_argument("data", nargs="?", default=str(BUNDLED), help="a neusight-kernels directory")
    parser.add_argument("--out", default=str(DEFAULT_MODEL), help="where the model goes (JSON)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    calls = load_neusight(args.data)
    model = fit_shipped(calls, load_device_specs(args.data))
    model.save(args.out)
    print(f"fitted on {len(calls):,} calls of {len(model.gpus)} GPUs in {time.perf_counter() - start:.0f} s: "
          f"launch overhead {model.overhead_s * 1e6:.1f} us, p90 factor {model.p90_factor:.2f} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
