#!/usr/bin/env python3
"""Trace Gavel's data-parallel job types that dprobe re-implements (the Transformer and the LSTM language
model of ``dprobe.profiling.dataparallel.gavel_models``) and print their trainable parameters and backward
windows beside ``JOB_TYPES``, which the fit and ``benchmarks/dataparallel.py`` read; the two ResNets are
pollux-placements' models and ``tools/pollux_backward_window.py`` checks them.

Usage: .venv/bin/python tools/gavel_dp_windows.py [--check]
``--check`` exits 1 when a count or a window (3 decimals) differs from ``JOB_TYPES``.
"""

from __future__ import annotations

import argparse
import sys

SPECS = {"Transformer": "transformer", "LM": "language_model"}  # job type -> factory in gavel_models


def traced(name: str, batch: int = 8) -> tuple[int, float | None]:
    """(trainable parameters of the module, backward window of its traced graph) of one of :data:`SPECS`."""
    from dprobe.graph.build import build_model_graph
    from dprobe.profiling.dataparallel import gavel_models
    from dprobe.profiling.dataparallel.timeline import backward_window

    if name not in SPECS:
        raise ValueError(f"unknown job type {name!r}: one of {', '.join(SPECS)}")
    module = getattr(gavel_models, SPECS[name])()
    graph = build_model_graph(gavel_models.JOB_TYPES[name].spec, batch=batch)
    return gavel_models.trainable_parameters(module), backward_window(graph)


def main(argv: list[str] | None = None) -> int:
    from dprobe.profiling.dataparallel.gavel_models import JOB_TYPES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when a count or window differs from JOB_TYPES")
    args = ap.parse_args(argv)
    differs = []
    for name in SPECS:
        job = JOB_TYPES[name]
        count, window = traced(name)
        shown = "-" if window is None else f"{window:.3f}"
        print(f"{name:12s} {count:>11d} {shown:>6s}  traced ({job.spec}); JOB_TYPES: {job.parameters}, "
              f"{job.backward_window:.3f}")
        if count != job.parameters or window is None or abs(window - job.backward_window) > 5e-4:
            differs.append(name)
            print(f"differs: {name}")
    return 1 if args.check and differs else 0


if __name__ == "__main__":
    sys.exit(main())
