"""``python -m dprobe.profiling.kernels [DIR] [--shape-free]``: fit the shipped kernel model on every GPU of a
NeuSight directory (default: the bundled ``datasets/neusight-kernels``) and write ``default_kernels.json``
(``--shape-free``: the variant without GEMM shapes, which replayed kernels are put on,
``default_kernels_shapefree.json``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from dprobe.profiling.kernels.data import load_device_specs, load_neusight
from dprobe.profiling.kernels.model import DEFAULT_MODEL, SHAPE_FREE_MODEL, fit_shipped

BUNDLED = Path(__file__).resolve().parents[3] / "datasets" / "neusight-kernels"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dprobe.profiling.kernels", description=__doc__)
    parser.add_argument("data", nargs="?", default=str(BUNDLED), help="a neusight-kernels directory")
    parser.add_argument("--shape-free", action="store_true",
                        help="the shape-free variant (features a replayed kernel has: class, FLOPs, bytes)")
    parser.add_argument("--out", default=None, help="where the model goes (JSON; default: the shipped one)")
    args = parser.parse_args(argv)
    out = args.out or str(SHAPE_FREE_MODEL if args.shape_free else DEFAULT_MODEL)
    start = time.perf_counter()
    calls = load_neusight(args.data)
    model = fit_shipped(calls, load_device_specs(args.data), shapes=not args.shape_free)
    model.save(out)
    print(f"fitted on {len(calls):,} calls of {len(model.gpus)} GPUs in {time.perf_counter() - start:.0f} s: "
          f"launch overhead {model.overhead_s * 1e6:.1f} us, p90 factor {model.p90_factor:.2f} -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
