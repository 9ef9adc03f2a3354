"""``dprobe profiles``: the collections of a profiles data set, and adding a new one from the collector."""

from __future__ import annotations

import argparse
import json

DEFAULT_DATA = "datasets/h200-profiles"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profiles", help="list or grow a profiles data set (runs measured on a GPU)",
        description="The collections of a data set laid out like datasets/h200-profiles, and adding a session "
        "of tools/collect_gpu_profiles.py to it (more architectures, batch sizes, other GPUs). Retrain "
        "afterwards: `python train.py +exp=coldstart coldstart.data_dir=DIR jobscale.enabled=true "
        "jobscale.data_dir=DIR`.")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="each collection: its GPU, its runs, where it came from",
                        description="Print each collection of the data set: GPU, runs by kind and status, source.")
    ls.add_argument("--data", default=DEFAULT_DATA, metavar="DIR", help="the data set (default: %(default)s)")
    ls.add_argument("--json", action="store_true", help="print one JSON object")
    ls.set_defaults(func=run_list)
    add = sub.add_parser(
        "add", help="append a collector session as the next collection",
        description="Append the OUT folder of tools/collect_gpu_profiles.py (runs.jsonl, samples.csv, steps.csv, "
        "env.json) to the data set as its next collection: run ids renumbered after the data set's own, NVML "
        "columns derived from the samples, the GPU, versions and provenance recorded in env.json. Nothing is "
        "written unless all of it reads and checks.")
    add.add_argument("source", metavar="OUT", help="the collector's output folder")
    add.add_argument("--data", default=DEFAULT_DATA, metavar="DIR", help="the data set to grow (default: %(default)s)")
    add.add_argument("--note", default="", help="a line of provenance kept in env.json (who, where, why)")
    add.add_argument("--dry-run", action="store_true", help="check and print what would be added, write nothing")
    add.add_argument("--json", action="store_true", help="print one JSON object")
    add.set_defaults(func=run_add)


def run_list(args: argparse.Namespace) -> int:
    from dprobe.data import load_h200_profiles

    profiles = load_h200_profiles(args.data)
    out = {}
    for collection, runs in profiles.runs.groupby("collection"):
        env = profiles.env.get(f"collection_{int(collection)}", {})
        counts = runs.groupby(["kind", "status"]).size()
        out[int(collection)] = {"gpu": str(runs["gpu"].iloc[0]), "runs": {f"{k} {s}": int(n) for (k, s), n in
                                                                           counts.items()},
                                "torch": env.get("torch", ""), "source": env.get("source", ""),
                                "added": env.get("added", ""), "note": env.get("note", "")}
    if args.json:
        print(json.dumps(out))
        return 0
    for collection, info in out.items():
        runs = ", ".join(f"{n} {k}" for k, n in info["runs"].items())
        print(f"collection {collection}: {info['gpu']}, torch {info['torch'] or '?'}: {runs}")
        for key in ("source", "added", "note"):
            if info[key]:
                print(f"  {key}: {info[key]}")
    return 0


def run_add(args: argparse.Namespace) -> int:
    from dprobe.data.profile_import import add_collection

    summary = add_collection(args.source, args.data, note=args.note, dry_run=args.dry_run)
    if args.json:
        print(json.dumps(summary))
        return 0
    verb = "would add" if args.dry_run else "added"
    runs = ", ".join(f"{n} {k}" for k, n in summary["runs"].items())
    print(f"{verb} {summary['source']} to {args.data} as collection {summary['collection']} ({summary['gpu']}): "
          f"{runs}; {summary['samples']} NVML samples, {summary['steps']} steps")
    if summary["renamed"]:
        shown = ", ".join(f"{a}->{b}" for a, b in list(summary["renamed"].items())[:6])
        more = len(summary["renamed"]) - 6
        print(f"  run ids renumbered after the data set's own: {shown}{f' (+{more} more)' if more > 0 else ''}")
    if not args.dry_run:
        print(f"  retrain: python train.py +exp=coldstart coldstart.data_dir={args.data} jobscale.enabled=true "
              f"jobscale.data_dir={args.data}")
    return 0
