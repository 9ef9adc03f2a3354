"""Sidecar benchmark: forecast-cycle latency, CPU and RSS at 64 targets, RSS over a soak, /metrics scrape time.

    python benchmarks/sidecar.py [--targets 64] [--seconds 30] [--soak-seconds 60] [--scrape-targets 1000]

Targets (from the sidecar issue): forecast cycle p99 <= 100 ms, mean CPU <= 10 % of one core,
RSS <= 400 MB, RSS growth over the soak < 5 %, one scrape of 1,000 targets <= 50 ms. The scrapes are timed
as Prometheus asks (text format: the sidecar's fast renderer) and, for comparison, as an OpenMetrics scraper
asks (client_python's renderer of the same collector).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
import urllib.request

import numpy as np
from process import rss_mb  # benchmarks/process.py

from dprobe.forecaster.loading import open_forecaster
from dprobe.services.sidecar.config import SidecarConfig
from dprobe.services.sidecar.service import Sidecar
from dprobe.services.sources.base import Sample
from dprobe.services.sources.synthetic import SyntheticSource


class ChurningSource(SyntheticSource):
    """Synthetic targets where a quarter of the pods are replaced by new ones every ``churn`` seconds."""

    def __init__(self, n_targets: int, churn: float):
        super().__init__(n_targets)
        self.churn = churn

    def poll(self) -> list[Sample]:
        gen = int(time.time() // self.churn)
        out = []
        for i, s in enumerate(super().poll()):
            if i % 4 == 0:
                s = Sample(f"{s.target}-g{gen}", s.ts, s.memory_bytes, s.utilization_ratio, s.labels)
            out.append(s)
        return out


def prefill(sidecar: Sidecar, source: SyntheticSource, seconds: float, every: float) -> None:
    """Backfill the windows with ``seconds`` of history, as after an hour of running."""
    now = time.time()
    clock = source.clock
    for t in np.arange(now - seconds, now, every):
        source.clock = lambda t=t: float(t)
        sidecar.store.add(source.poll(), source.name)
    source.clock = clock


def config(**kw) -> SidecarConfig:
    return SidecarConfig(listen_address="127.0.0.1", port=0, **kw)


def bench_cycle(n_targets: int, cycles: int, checkpoint: str | None = None, model: str = "dprobe") -> dict:
    src = SyntheticSource(n_targets)
    sc = Sidecar(config(), sources=[src], model=open_forecaster(checkpoint, model))
    prefill(sc, src, sc.config.window_seconds, sc.config.sample_interval)
    times = []
    for _ in range(cycles):
        sc.store.add(src.poll(), src.name)
        t = time.perf_counter()
        sc.engine.cycle()
        times.append(time.perf_counter() - t)
    ms = np.array(times) * 1000
    return {"targets": n_targets, "cycles": cycles, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max())}


def bench_live(n_targets: int, seconds: float, soak: float, churn: float, checkpoint: str | None = None,
               model: str = "dprobe") -> dict:
    src = ChurningSource(n_targets, churn) if soak else SyntheticSource(n_targets)
    cfg = config(drop_after=max(30.0, churn)) if soak else config()
    sc = Sidecar(cfg, sources=[src], model=open_forecaster(checkpoint, model))
    prefill(sc, SyntheticSource(n_targets), sc.config.window_seconds, sc.config.sample_interval)
    sc.start()
    try:
        time.sleep(min(15.0, seconds / 3))  # warm-up: first cycles, allocator settles
        rss0, cpu0, wall0 = rss_mb(), time.process_time(), time.monotonic()
        samples = [rss0]
        while time.monotonic() - wall0 < seconds + soak:
            time.sleep(1.0)
            samples.append(rss_mb())
        cpu = (time.process_time() - cpu0) / (time.monotonic() - wall0)
        count = sc.forecast_seconds._sum.get()  # seconds spent forecasting, for context
    finally:
        sc.stop()
    late = samples[len(samples) // 2:]
    return {"targets": n_targets, "seconds": round(seconds + soak, 1), "cpu_pct_of_one_core": 100 * cpu,
            "rss_mb_start": rss0, "rss_mb_end": samples[-1], "rss_mb_max": max(samples),
            "rss_growth_pct": 100 * (np.median(late) - rss0) / rss0, "tracked_targets": len(sc.store.latest),
            "forecast_seconds_total": count}


TEXT = "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"  # what Prometheus sends
OPENMETRICS = "application/openmetrics-text;version=1.0.0"


def bench_scrape(n_targets: int, scrapes: int, checkpoint: str | None = None, model: str = "dprobe",
                 client_python_scrapes: int = 5) -> dict:
    src = SyntheticSource(n_targets)
    sc = Sidecar(config(), sources=[src], model=open_forecaster(checkpoint, model))
    prefill(sc, src, 600, 10.0)
    sc.store.add(src.poll(), src.name)
    sc.engine.cycle()
    sc.start()
    sc.stop_event.set()  # serve only: no sampling while timing the scrapes
    url = sc.server.url + "/metrics"

    def timed(accept: str, n: int) -> tuple[np.ndarray, int]:
        req = urllib.request.Request(url, headers={"Accept": accept})
        times, size = [], 0
        for _ in range(n):
            t = time.perf_counter()
            with urllib.request.urlopen(req, timeout=30) as r:
                size = len(r.read())
            times.append(time.perf_counter() - t)
        return np.array(times) * 1000, size

    try:
        ms, size = timed(TEXT, scrapes)
        slow, _ = timed(OPENMETRICS, client_python_scrapes)
    finally:
        sc.stop()
    return {"targets": n_targets, "scrapes": scrapes, "bytes": size, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max()),
            "client_python_p50_ms": float(np.percentile(slow, 50))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", type=int, default=64, help="targets sampled every second in the live run")
    p.add_argument("--seconds", type=float, default=30.0, help="live run measured for CPU and RSS")
    p.add_argument("--soak-seconds", type=float, default=0.0, help="extra live time with target churn")
    p.add_argument("--churn-seconds", type=float, default=20.0, help="a quarter of the targets renamed this often")
    p.add_argument("--cycles", type=int, default=100, help="forecast cycles timed (latency percentiles)")
    p.add_argument("--scrape-targets", type=int, default=1000, help="targets in the /metrics scrapes timed")
    p.add_argument("--scrapes", type=int, default=30, help="/metrics scrapes timed")
    p.add_argument("--json", action="store_true", help="also print the figures as one JSON object")
    p.add_argument("--checkpoint", help="a trained dprobe.onnx or dprobe.pt to forecast with (default: --model)")
    p.add_argument("--model", default="dprobe",
                   help="without --checkpoint: dprobe (the forecaster shipped with dprobe) or a baseline (ewma, ...)")
    a = p.parse_args(argv)
    cycle = bench_cycle(a.targets, a.cycles, a.checkpoint, a.model)
    live = bench_live(a.targets, a.seconds, a.soak_seconds, a.churn_seconds, a.checkpoint, a.model)
    scrape = bench_scrape(a.scrape_targets, a.scrapes, a.checkpoint, a.model)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    checks = [
        ("forecast cycle p99 (ms)", cycle["p99_ms"], 100.0),
        ("mean CPU (% of one core)", live["cpu_pct_of_one_core"], 10.0),
        ("RSS (MB)", live["rss_mb_max"], 400.0),
        ("RSS growth over the run (%)", live["rss_growth_pct"], 5.0),
        (f"scrape of {a.scrape_targets} targets p99 (ms)", scrape["p99_ms"], 50.0),
    ]
    report = {"cycle": cycle, "live": live, "scrape": scrape, "peak_rss_mb_whole_benchmark": peak_rss,
              "checks": [{"name": n, "value": v, "target": t, "ok": bool(v <= t)} for n, v, t in checks],
              "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    if a.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"forecast cycle, {cycle['targets']} targets: p50 {cycle['p50_ms']:.1f} ms, p99 {cycle['p99_ms']:.1f} ms")
        print(f"live {live['seconds']} s, {live['targets']} targets @1 s: CPU {live['cpu_pct_of_one_core']:.1f} %, "
              f"RSS {live['rss_mb_start']:.0f} -> {live['rss_mb_end']:.0f} MB (max {live['rss_mb_max']:.0f}, "
              f"growth {live['rss_growth_pct']:+.1f} %), tracked {live['tracked_targets']}")
        print(f"scrape, {scrape['targets']} targets ({scrape['bytes'] / 1e6:.1f} MB): p50 {scrape['p50_ms']:.1f} ms, "
              f"p99 {scrape['p99_ms']:.1f} ms (client_python's renderer, as an OpenMetrics scraper gets it: "
              f"p50 {scrape['client_python_p50_ms']:.1f} ms)")
        for c in report["checks"]:
            mark = "ok  " if c["ok"] else "FAIL"
            print(f"  [{mark}] {c['name']}: {c['value']:.1f} (target <= {c['target']:g})")
    return 0 if all(c["ok"] for c in report["checks"] if not math.isnan(c["value"])) else 1


if __name__ == "__main__":
    sys.exit(main())
