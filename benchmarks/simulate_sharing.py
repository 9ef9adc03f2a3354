"""`dprobe simulate sharing` cross-validated over pods and time, at 80 and 141 GB.

The pods of alibaba-genai-2026 fall into groups by a stable hash of their id, the part of the trace no
forecaster trained on into four spans of about 2.3 hours; each group over each span (a fold) is packed on
its own (:mod:`dprobe.sim.sharing.cv`). Printed per fold and pooled over folds, with 95 % intervals (a
fold: bootstrap over its pods; pooled: over pods and spans): the shipped default (``dprobe``, the settings
of ``dprobe simulate sharing``), peak packing, one pod per GPU and the oracle, and the nested choice:
the setting chosen on the other groups over the other spans, scored on the fold. Then every candidate's
pooled figures and whether it never loses to peak packing.

    .venv/bin/python benchmarks/simulate_sharing.py [--sizes 80GB,141GB] [--groups 5] [--json] [--check]

``--check`` exits 1 unless the choice on all folds is the shipped default and the shipped default is at
least as good as peak packing (GPU-hours and memory overflow) in every fold at every size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="80GB,141GB",
                    help="GPU memory sizes, each with its unit (80GB, 141GiB; default: %(default)s)")
    ap.add_argument("--groups", type=int, default=None, help="pod groups (default: 5)")
    ap.add_argument("--data", metavar="DIR", help="a directory laid out like alibaba-genai-2026 (default: bundled)")
    ap.add_argument("--draws", type=int, default=2000, help="bootstrap draws (default: %(default)s)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless the shipped default is the choice and never loses to peak packing")
    args = ap.parse_args(argv)

    from dprobe.core.units import parse_bytes
    from dprobe.data.alibaba import NAME, load_alibaba
    from dprobe.data.registry import bundled_dir
    from dprobe.sim.cli import register
    from dprobe.sim.sharing.cli import sharing_settings
    from dprobe.sim.sharing.cv import GROUPS, cross_validate
    from dprobe.sim.sharing.packing import load_forecaster, pod_series

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    settings = sharing_settings(parser.parse_args(["simulate", "sharing"]))  # dprobe simulate sharing's defaults
    started = time.process_time()
    series = pod_series(load_alibaba(args.data or bundled_dir(NAME)))
    sizes = [parse_bytes(s, "--sizes") for s in args.sizes.split(",")]
    progress = None if args.json else (lambda label: print(f"running {label} ...", file=sys.stderr, flush=True))
    out = cross_validate(series, sizes, args.groups or GROUPS, forecaster=load_forecaster(), draws=args.draws,
                         progress=progress, shipped=settings)
    out.update(dataset=NAME, pods=len(series.ids), cpu_seconds=time.process_time() - started)
    if args.json:
        json.dump(out, sys.stdout)
        print()
    else:
        _print(out)
    return 1 if args.check and not (out["shipped_is_chosen"] and out["default_never_loses"]) else 0


def _fig(f: dict) -> str:
    s, o = f["gpu_hours_saved_ci"], f["pod_minutes_over_memory_ci"]
    return (f"{f['gpu_hours_saved_pct']:.1f} % [{s[0]:.1f}, {s[1]:.1f}] / "
            f"{f['pod_minutes_over_memory_pct']:.3f} % [{o[0]:.3f}, {o[1]:.3f}]")


def _print(out: dict) -> None:
    from dprobe.core.units import format_bytes

    names = ("dprobe", "peak", "one-per-gpu", "oracle", "nested")
    print(f"{out['dataset']}: {out['pods']} pods in {out['groups']} groups x {len(out['spans'])} spans "
          f"{out['spans']} of the trace; shipped default: {out['shipped_label']}; CPU {out['cpu_seconds']:.0f} s")
    print("each cell: GPU-hours saved against one pod per GPU [95 % interval] / pod-minutes over memory [interval]")
    for size in (str(s) for s in out["sizes_bytes"]):
        print(f"\n## {format_bytes(int(size))} GPUs\n")
        print("| fold | pods | dprobe (shipped) | peak | one-per-gpu | oracle | nested: chosen on the other folds |")
        print("| --- | ---: | --- | --- | --- | --- | --- |")
        for c in out["cells"]:
            f = c["sizes"][size]
            print(f"| {c['cell']} | {c['pods']} | " + " | ".join(_fig(f[n]) for n in names[:-1])
                  + f" | {f['nested']['choice']}: {_fig(f['nested'])} |")
        o = out["overall"][size]
        print("| **pooled** | | " + " | ".join(_fig(o[n]) for n in names) + " |")
        for n in ("dprobe", "nested"):
            d = o[n]
            print(f"{n} minus peak: saved {d['saved_minus_reference']:+.2f} points "
                  f"[{d['saved_minus_reference_ci'][0]:+.2f}, {d['saved_minus_reference_ci'][1]:+.2f}], overflow "
                  f"{d['over_minus_reference']:+.3f} points [{d['over_minus_reference_ci'][0]:+.3f}, "
                  f"{d['over_minus_reference_ci'][1]:+.3f}]")
    print("\n| candidate | " + " | ".join(f"{format_bytes(s)} saved / over" for s in out["sizes_bytes"])
          + " | never loses to peak |")
    print("| --- | " + " | ".join("---" for _ in out["sizes_bytes"]) + " | --- |")
    for label, c in out["candidates"].items():
        print(f"| {label} | " + " | ".join(f"{c[str(s)]['gpu_hours_saved_pct']:.2f} % / "
                                            f"{c[str(s)]['pod_minutes_over_memory_pct']:.3f} %"
                                            for s in out["sizes_bytes"]) + f" | {'yes' if c['never_loses'] else 'no'} |")
    which = "the shipped default" if out["shipped_is_chosen"] else "NOT the shipped default"
    print(f"\nchosen on all folds: {out['chosen_on_all_cells']} ({which})")
    print(f"{'PASS' if out['default_never_loses'] else 'MISS'}  the shipped default is at least as good as peak "
          "packing in every fold at every size (GPU-hours and overflow)")
    print(f"{'PASS' if out['nested_never_loses'] else 'MISS'}  so is each fold's nested choice on that fold")


if __name__ == "__main__":
    sys.exit(main())
