"""How long ``dprobe predict`` takes, wall clock, as a user runs it (a fresh process each time), beside the
same command with ``--search-batch`` (the largest-batch search, which every call ran before it became an
option) and the bare interpreter start with torch imported (what no prediction can go below).

    .venv/bin/python benchmarks/predict_speed.py [--model torchvision:resnet50] [--batch 256] [--repeat 3]

Target: ResNet-50 at batch 256 in 5 s or less on 2 idle cores.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_S = 5.0


def wall(cmd: list[str], repeat: int) -> list[float]:
    """Seconds each of ``repeat`` runs of ``cmd`` took (it must succeed)."""
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out.append(time.perf_counter() - t)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="torchvision:resnet50")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    python = sys.executable
    dprobe = [python, "-m", "dprobe.cli", "predict", args.model, "--batch", str(args.batch), "--json"]
    runs = {"import torch (floor)": wall([python, "-c", "import torch, torchvision"], args.repeat),
            "dprobe predict": wall(dprobe, args.repeat),
            "dprobe predict --search-batch": wall([*dprobe, "--search-batch"], args.repeat)}
    base = statistics.median(runs["dprobe predict"])
    print(f"{args.model} batch {args.batch}, {args.repeat} runs each, on {Path('/proc/loadavg').read_text().split()[0]} "
          "load (1 min)\n")
    print("| command | median s | min s | vs dprobe predict |")
    print("| --- | ---: | ---: | ---: |")
    for name, t in runs.items():
        print(f"| {name} | {statistics.median(t):.2f} | {min(t):.2f} | {statistics.median(t) / base:.2f} |")
    print(f"\n{'PASS' if base <= TARGET_S else 'MISS'}  dprobe predict in {TARGET_S:.0f} s or less (median {base:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
