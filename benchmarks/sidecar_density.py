"""The sidecar as a node agent at density: one agent forecasting 8, 64 and 256 pods.

    python benchmarks/sidecar_density.py [--pods 8,64,256] [--cycles 30] [--json]

Each size runs in a fresh process (so its RSS is its own), with the shipped forecaster on synthetic
pods whose windows hold an hour of history, as after an hour of running. Printed per size: the forecast
cycle (p50 / p99, and per pod), the resident memory after the cycles and its growth per pod over the
smallest size, the ``/metrics`` body (bytes and series per pod) and one scrape's time. The per-pod columns
are what a platform team sizes a node agent from: a DaemonSet's memory limit is the agent's base plus the
per-pod figure times the most pods a node runs (``max_targets``, docs/sidecar.md, bounds the rest).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEXT = "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"  # what Prometheus sends


def measure(pods: int, cycles: int) -> dict:
    """One size, in this process: forecast ``cycles`` cycles over ``pods`` synthetic pods, then scrape."""
    import numpy as np
    from process import rss_mb  # benchmarks/process.py
    from sidecar import config, prefill  # benchmarks/sidecar.py

    from dprobe.forecaster.loading import open_forecaster
    from dprobe.services.sidecar.service import Sidecar
    from dprobe.services.sources.synthetic import SyntheticSource

    src = SyntheticSource(pods)
    sc = Sidecar(config(), sources=[src], model=open_forecaster(None, "dprobe"))
    prefill(sc, src, sc.config.window_seconds, sc.config.sample_interval)
    rss_idle = rss_mb()
    times = []
    for _ in range(cycles):
        sc.store.add(src.poll(), src.name)
        t = time.perf_counter()
        sc.engine.cycle()
        times.append(time.perf_counter() - t)
    ms = np.array(times) * 1000
    rss = rss_mb()
    sc.start()
    sc.stop_event.set()  # serve only: no sampling while scraping
    try:
        req = urllib.request.Request(sc.server.url + "/metrics", headers={"Accept": TEXT})
        scrape_ms, body = [], b""
        for _ in range(5):
            t = time.perf_counter()
            with urllib.request.urlopen(req, timeout=30) as r:
                body = r.read()
            scrape_ms.append((time.perf_counter() - t) * 1000)
    finally:
        sc.stop()
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return {"pods": pods, "cycles": cycles, "cycle_p50_ms": float(np.percentile(ms, 50)),
            "cycle_p99_ms": float(np.percentile(ms, 99)), "rss_mb_before_cycles": rss_idle, "rss_mb": rss,
            "metrics_bytes": len(body), "metrics_series": series, "scrape_p50_ms": float(np.median(scrape_ms))}


def run_size(pods: int, cycles: int) -> dict:
    """One size in a fresh interpreter, so that the resident memory it reports is its own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}
    out = subprocess.run([sys.executable, __file__, "--one", str(pods), "--cycles", str(cycles)],
                         capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"the run with {pods} pods failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    """The per-size table with per-pod columns and the growth over the smallest size."""
    base = rows[0]
    lines = ["| pods | cycle p50 / p99 (ms) | per pod (ms) | RSS (MB) | RSS per added pod (MB) | "
             "/metrics (KB) | bytes / series per pod | scrape (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        added = r["pods"] - base["pods"]
        per_pod_rss = (r["rss_mb"] - base["rss_mb"]) / added if added else float("nan")
        lines.append(
            f"| {r['pods']} | {r['cycle_p50_ms']:.1f} / {r['cycle_p99_ms']:.1f} | {r['cycle_p50_ms'] / r['pods']:.2f} "
            f"| {r['rss_mb']:.0f} | {per_pod_rss:.2f} | {r['metrics_bytes'] / 1e3:.0f} | "
            f"{r['metrics_bytes'] / r['pods']:.0f} / {r['metrics_series'] / r['pods']:.1f} | {r['scrape_p50_ms']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", default="8,64,256", help="comma-separated pod counts, smallest first (default: %(default)s)")
    p.add_argument("--cycles", type=int, default=30, help="forecast cycles timed at each size (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # one size in this process (run_size)
    a = p.parse_args(argv)
    if a.one is not None:
        sys.path[:0] = [str(HERE)]
        print(json.dumps(measure(a.one, a.cycles)))
        return 0
    try:
        sizes = sorted({int(s) for s in a.pods.split(",") if s.strip()})
    except ValueError:
        p.error(f"--pods takes comma-separated whole numbers, got {a.pods!r}")
    if not sizes or sizes[0] < 1:
        p.error("--pods needs at least one count of 1 or more")
    rows = []
    for n in sizes:
        print(f"{n} pods ...", file=sys.stderr, flush=True)
        rows.append(run_size(n, a.cycles))
    print(json.dumps(rows, indent=1) if a.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
