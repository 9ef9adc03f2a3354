"""Scaler at fleet scale: a real Prometheus over a backfilled TSDB, the real scaler, workloads by the thousand.

    python benchmarks/scale_scaler.py [--sizes 10,100,1000,5000] [--pods-per-workload 4] [--cycles 5]
                                      [--history-seconds 1800] [--step-seconds 30] [--modes pods,recorded]

For each size (workloads), the series the sidecars (utilisation forecasts, horizons 60 and 300 s, p50 / p90 /
p99), dcgm-exporter (one GPU per pod) and kube-state-metrics (pod and ReplicaSet owners, spec replicas, GPU
requests, pod phases) would write for ``--pods-per-workload`` pods per Deployment across 20 namespaces,
``--history-seconds`` of them every ``--step-seconds``, are written as OpenMetrics and backfilled with
``promtool tsdb create-blocks-from openmetrics``; a Prometheus on loopback serves them (with dprobe's rules,
deploy/prometheus/dprobe-rules.yaml, in mode recorded). Every workload is listed with ``min_replicas: 0`` and
the scaler is built as ``dprobe scaler`` builds it (``load_config`` of a YAML file, ``Scaler``, recommend mode,
its HTTP server serving /metrics), in a process of its own per size and mode. After a first cycle, ``--cycles``
cycles are timed.

Modes: ``pods`` reads every pod's forecast (the default) and wakes workloads with ``activations_query`` (one query
for all); ``recorded`` reads the recording rules' per-workload series instead (``recorded_series: true``); ``own``
gives each workload an activation query of its own (batched, ``ACTIVATION_BATCH`` of dprobe.services.scaler.demand a request); ``baseline``
runs ``own`` with the dprobe package of another checkout (``--baseline DIR``, e.g. ``git archive REV | tar -x -C
DIR``), ``base-pods`` and ``base-recorded`` run ``pods`` and ``recorded`` with it (``base-recorded`` with its
rules too). Each Prometheus starts on the backfilled blocks with a head of its own (the blocks hard-linked), so
that no mode reads what another mode's rules recorded.
Printed per size and mode: cycle seconds (mean), CPU seconds per cycle (the scaler's process), queries per cycle
(Prometheus's own request counter), peak RSS (MB), one /metrics scrape as Prometheus asks for it (s, text format,
gzip) and the page's rendering alone (s), the rule group
``dprobe-scaler-workloads``' last evaluation (s, Prometheus's own figure, with its slowest rule) and the 1-minute
load average while the mode ran; then each size's ratio to the size before it (same mode) beside the ratio of
workloads, and the cycle's ratio to the baseline mode of the same size and read (``base-pods``, ``base-recorded``).

Targets (on 2 idle cores): 5,000 workloads x 4 pods <= 2 s a cycle, 20,000 <= 8 s, RSS <= 300 MB, /metrics
<= 1 s, queries per cycle the same at every size.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prometheus_process import free_port, running  # noqa: E402  (benchmarks/prometheus_process.py)
from scaler import fleet  # noqa: E402  (benchmarks/scaler.py: the same pods as its stand-in's)

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "dprobe-rules.yaml"
HORIZONS = (60, 300)
QUANTILES = ("0.5", "0.9", "0.99")
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
TARGETS = {5000: 2.0, 20000: 8.0}  # workloads: cycle seconds
# how far back an instant query looks for a series' last sample: the backfilled series end when their file is
# written, and stay current however long promtool and the scaler take (samples ahead of that time would keep
# Prometheus from recording anything: the head takes no sample older than its newest block's end)
LOOKBACK = "3h"
RULES_WAIT = 1800  # s: the rules' first evaluation (minutes at 20,000 workloads on a loaded 2-core machine)
REUSE_SECONDS = 2 * 3600  # a TSDB kept in --workdir is used again while its series are this recent


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def write_openmetrics(path: Path, workloads: int, per_workload: int, history: float, step: float,
                      end: float) -> int:
    """The series of ``workloads`` Deployments of ``per_workload`` pods (:func:`scaler.fleet`, one GPU each) as
    an OpenMetrics file, a sample every ``step`` s over the ``history`` s before ``end``; returns the series
    written."""
    pods = [(ns, w, pod, value) for ns, w, pod, value, _ in fleet(workloads * per_workload, per_workload)]
    deployments = sorted({(ns, w) for ns, w, _, _ in pods})
    times = [end - history + i * step for i in range(int(history // step) + 1)]
    series = 0
    with path.open("w") as out:
        def family(name: str, rows: Iterator[tuple[str, float]]) -> None:
            nonlocal series
            out.write(f"# TYPE {name} gauge\n")
            for labels, value in rows:
                series += 1
                out.writelines(f"{name}{labels} {value} {t:.3f}\n" for t in times)

        family("dprobe_predicted_gpu_utilization_ratio", (
            (_labels(target=f"{ns}/{pod}", namespace=ns, pod=pod, container="main", UUID="", gpu="",
                     horizon_seconds=str(h), quantile=q, instance="10.0.0.1:9477", job="dprobe"),
             min(1.0, value * (0.8 + 0.2 * i)))
            for ns, _, pod, value in pods for h in HORIZONS for i, q in enumerate(QUANTILES)))
        family("DCGM_FI_DEV_GPU_UTIL", (
            (_labels(gpu="0", UUID=f"GPU-{i:08d}", namespace=ns, pod=pod, container="main", Hostname=f"node-{i // 8}",
                     instance=f"10.0.1.{i // 8 % 250}:9400", job="dcgm-exporter"), round(100 * value))
            for i, (ns, _, pod, value) in enumerate(pods)))
        ksm = {"instance": "10.0.2.1:8080", "job": "kube-state-metrics"}
        family("kube_pod_owner", (
            (_labels(namespace=ns, pod=pod, owner_kind="ReplicaSet", owner_name=f"{w}-7d9f8c6b5d",
                     owner_is_controller="true", **ksm), 1) for ns, w, pod, _ in pods))
        family("kube_replicaset_owner", (
            (_labels(namespace=ns, replicaset=f"{w}-7d9f8c6b5d", owner_kind="Deployment", owner_name=w,
                     owner_is_controller="true", **ksm), 1) for ns, w in deployments))
        family("kube_deployment_spec_replicas", (
            (_labels(namespace=ns, deployment=w, **ksm), per_workload) for ns, w in deployments))
        family("kube_pod_container_resource_requests", (
            (_labels(namespace=ns, pod=pod, container="main", node="node", resource="nvidia_com_gpu", unit="integer",
                     **ksm), 1) for ns, _, pod, _ in pods))
        family("kube_pod_status_phase", (
            (_labels(namespace=ns, pod=pod, phase=phase, **ksm), int(phase == "Running"))
            for ns, _, pod, _ in pods for phase in PHASES))
        out.write("# EOF\n")
    return series


def _get(url: str, timeout: float = 60) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def query(base: str, promql: str) -> list[dict]:
    doc = json.loads(_get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"))
    return doc["data"]["result"]


def fresh_head(data: Path, run: Path) -> None:
    """``run``: the backfilled blocks of ``data`` hard-linked (they are never written to), without the head, WAL or
    recorded series a Prometheus run on ``data`` before left."""
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    for block in data.iterdir():
        if block.is_dir() and (block / "meta.json").exists():
            shutil.copytree(block, run / block.name, copy_function=os.link)


def rule_evaluation(base: str, group: str = "dprobe-scaler-workloads") -> tuple[float, str]:
    """The rule group's last evaluation (s) as Prometheus reports it (``/api/v1/rules``), and its slowest rule
    with that rule's seconds; (0, '') without the group."""
    for g in json.loads(_get(f"{base}/api/v1/rules"))["data"]["groups"]:
        if g["name"] == group:
            slowest = max(g["rules"], key=lambda r: r.get("evaluationTime", 0.0))
            return float(g.get("evaluationTime", 0.0)), f"{slowest['name']} {slowest.get('evaluationTime', 0.0):.2f}"
    return 0.0, ""


@contextmanager
def prometheus(data: Path, workdir: Path, rules: bool, evaluation_seconds: float = 30,
               rules_file: Path = RULES) -> Iterator[str]:
    """A Prometheus on loopback over the TSDB in ``data``, scraping nothing, its queries looking :data:`LOOKBACK`
    back, with dprobe's rules (``rules_file``) where ``rules`` (their first evaluation awaited); yields its base
    URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("no prometheus binary on PATH (apt-get install prometheus)")
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"evaluation_interval": f"{evaluation_seconds:g}s"},
                                      "rule_files": [str(rules_file)] if rules else []}))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = [binary, f"--config.file={config}", f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=30d", f"--query.lookback-delta={LOOKBACK}"]
    with running(args, workdir / "prometheus.log", lambda: b"Ready" in _get(base + "/-/ready", 1), 300):
        deadline = time.monotonic() + RULES_WAIT
        while rules and not query(base, "count(dprobe:namespace_requested_gpus:sum)"):  # the group's last rule
            if time.monotonic() > deadline:
                raise RuntimeError("the recording rules recorded nothing")
            time.sleep(0.5)
        yield base


# the activation value of every workload at once (activations_query); as each workload's own activation query:
# kube-state-metrics' spec replicas of its Deployment
ACTIVATIONS = 'label_replace(kube_deployment_spec_replicas, "workload", "$1", "deployment", "(.+)")'
OWN_ACTIVATION = 'sum(kube_deployment_spec_replicas{{namespace="{ns}",deployment="{w}"}})'
MODES = {  # mode: (recorded_series, each workload's own activation query)
    "pods": (False, False), "recorded": (True, False), "own": (False, True), "baseline": (False, True),
    "base-pods": (False, False), "base-recorded": (True, False)}
BASELINES = {"base-pods": "pods", "base-recorded": "recorded"}  # the modes run with --baseline's code: what they are


def scaler_config(url: str, workloads: int, per_workload: int, mode: str, port: int) -> dict:
    """The scaler's YAML settings: every Deployment listed, scaling to zero (``min_replicas: 0``) and woken by
    ``activations_query``, or (modes own and baseline) by an activation query of its own."""
    recorded, own = MODES[mode]
    listed = [{"namespace": ns, "name": w, "min_replicas": 0,
               **({"activation_query": OWN_ACTIVATION.format(ns=ns, w=w)} if own else {})}
              for ns, w in sorted({(ns, w) for ns, w, *_ in fleet(workloads * per_workload, per_workload)})]
    return {"prometheus_url": url, "interval": 3600, "http_timeout": 120, "listen_address": "127.0.0.1",
            "port": port, "log_level": "warning", "workloads": listed,
            **({"recorded_series": True} if recorded else {}), **({} if own else {"activations_query": ACTIVATIONS})}


def prometheus_queries(base: str) -> float:
    """Instant queries Prometheus has answered (its own counter, GET and POST)."""
    text = _get(f"{base}/metrics").decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query"' in line)


# what Prometheus 2.42 sends with a scrape (the scaler answers it in text format, gzipped)
SCRAPE_HEADERS = {"Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
                            "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1", "Accept-Encoding": "gzip"}


def measure_one(config_path: str, prometheus_url: str, cycles: int) -> dict:
    """In this process: the scaler as ``dprobe scaler --config`` builds it, its first cycle run by its own loop,
    then ``cycles`` cycles timed; one /metrics scrape timed as Prometheus asks for it (text format, gzip), and the
    page's rendering alone; RSS."""
    from dprobe.services.scaler.config import load_config
    from dprobe.services.scaler.service import Scaler

    scaler = Scaler(load_config({"config": config_path}, env={}))
    scaler.start()
    while scaler.last_cycle_at is None:
        time.sleep(0.05)
    before = prometheus_queries(prometheus_url)
    wall, cpu = [], []
    for _ in range(cycles):
        t, c = time.perf_counter(), time.process_time()
        scaler.cycle()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    queries = (prometheus_queries(prometheus_url) - before) / cycles
    assert scaler.server is not None
    t = time.perf_counter()
    request = urllib.request.Request(f"http://127.0.0.1:{scaler.server.port}/metrics", headers=SCRAPE_HEADERS)
    with urllib.request.urlopen(request, timeout=60) as r:
        body = r.read()
        page = gzip.decompress(body) if r.headers.get("Content-Encoding") == "gzip" else body
    scrape = time.perf_counter() - t
    t = time.perf_counter()
    scaler.collector.render_text(scaler.registry)
    render = time.perf_counter() - t
    published = [d for d in scaler.decisions.values() if d.published]
    scaler.stop()
    return {"published": len(published), "replicas": sum(d.replicas for d in published),
            "demand": sum(d.demand or 0.0 for d in published), "cycle_s": sum(wall) / cycles, "cpu_s": sum(cpu) / cycles, "queries": queries,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "metrics_s": scrape,
            "render_s": render, "metrics_kb": len(page) / 1024, "metrics_gzip_kb": len(body) / 1024, "decisions": len(scaler.decisions), "errors": dict(scaler.errors_total)}


def run(sizes: list[int], per_workload: int = 4, cycles: int = 5, history: float = 1800, step: float = 30,
        modes: tuple[str, ...] = ("pods", "recorded", "own"), workdir: Path | None = None,
        baseline: Path | None = None) -> list[dict]:
    """Per size and mode, the figures of :func:`measure_one` (each in a scaler process of its own) with
    ``workloads``, ``mode`` and the TSDB's ``series``. Mode ``baseline`` runs the ``pods`` mode with the dprobe
    package found in ``baseline`` (a checkout of another revision: ``git worktree add DIR REV``)."""
    if {"baseline", *BASELINES} & set(modes) and baseline is None:
        raise ValueError("mode baseline needs the directory of a checkout to run (--baseline DIR)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="dprobe-scale-") as tmp:
        base = Path(workdir or tmp)
        for n in sizes:
            work = base / f"w{n}"
            work.mkdir(parents=True, exist_ok=True)
            data, marker = work / "data", work / "tsdb.json"
            built = {"workloads": n, "per_workload": per_workload, "history": history, "step": step}
            kept = json.loads(marker.read_text()) if workdir is not None and marker.exists() else {}
            if {k: kept.get(k) for k in built} == built and time.time() - kept["at"] < REUSE_SECONDS:
                series = kept["series"]  # a TSDB this run's --workdir already holds, recent enough
            else:
                shutil.rmtree(data, ignore_errors=True)
                openmetrics = work / "series.om"
                at = time.time()
                series = write_openmetrics(openmetrics, n, per_workload, history, step, at)
                subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(openmetrics),
                                str(data)], check=True, capture_output=True)
                openmetrics.unlink()
                marker.write_text(json.dumps({**built, "series": series, "at": at}))
            for mode in modes:
                try:
                    rows.append(_measure(n, mode, per_workload, cycles, data, work, series, baseline))
                except (RuntimeError, OSError, subprocess.SubprocessError) as exc:  # the other sizes and modes go on
                    rows.append({"workloads": n, "pods": n * per_workload, "mode": mode, "series": series,
                                 "error": str(exc).splitlines()[-1][:300]})
            if workdir is None:
                shutil.rmtree(data, ignore_errors=True)
    return rows


def _measure(n: int, mode: str, per_workload: int, cycles: int, data: Path, work: Path, series: int,
             baseline: Path | None) -> dict:
    """One size in one mode: a Prometheus over ``data`` (a head of its own), the scaler in a process of its own."""
    code = baseline.resolve() if baseline is not None and (mode == "baseline" or mode in BASELINES) else ROOT
    run_data = work / "run"
    fresh_head(data, run_data)
    try:
        with prometheus(run_data, work, rules=MODES[mode][0], rules_file=code / RULES.relative_to(ROOT)) as url:
            config = work / f"scaler-{mode}.yaml"
            config.write_text(yaml.safe_dump(scaler_config(url, n, per_workload, mode, free_port())))
            out = subprocess.run([sys.executable, __file__, "--measure-one", str(config), url, str(cycles)],
                                 capture_output=True, text=True, check=False,
                                 env={**os.environ, "PYTHONPATH": str(code)}, cwd=code)
            rules_s, slowest = rule_evaluation(url) if MODES[mode][0] else (0.0, "")
            load = os.getloadavg()[0]
    finally:
        shutil.rmtree(run_data, ignore_errors=True)
    if out.returncode != 0:
        raise RuntimeError(f"scaler at {n} workloads ({mode}) failed: {out.stderr[-3000:]}")
    return {"workloads": n, "pods": n * per_workload, "mode": mode, "series": series, "rules_s": rules_s,
            "slowest_rule": slowest, "load": load, **json.loads(out.stdout.strip().splitlines()[-1])}


def table(rows: list[dict]) -> str:
    """The figures as a Markdown table, with each size's ratio to the size before it (same mode) and to the
    baseline of the same size and read (``base-pods`` for ``pods``, ``base-recorded`` for ``recorded``)."""
    lines = ["| workloads | pods | mode | series | cycle (s) | CPU / cycle (s) | queries / cycle | RSS (MB) | "
             "/metrics (s) | render (s) | rules (s) | load | x workloads | x cycle | x CPU | cycle / baseline |",
             "|" + "---:|" * 4 + "---:|" * 12]
    last: dict[str, dict] = {}
    bases = {(r["workloads"], BASELINES[r["mode"]]): r for r in rows if r["mode"] in BASELINES and "error" not in r}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['workloads']} | {r['pods']} | {r['mode']} | {r['series']} | failed: {r['error']} |")
            continue
        prev = last.get(r["mode"])
        ratios = (f"{r['workloads'] / prev['workloads']:.0f} | {r['cycle_s'] / prev['cycle_s']:.1f} | "
                  f"{r['cpu_s'] / prev['cpu_s']:.1f}") if prev else "- | - | -"
        base = bases.get((r["workloads"], r["mode"]))
        to_base = f"{r['cycle_s'] / base['cycle_s']:.2f}" if base else "-"
        lines.append(f"| {r['workloads']} | {r['pods']} | {r['mode']} | "
                     f"{r['series']} | {r['cycle_s']:.3f} | {r['cpu_s']:.3f} | {r['queries']:.1f} | "
                     f"{r['rss_mb']:.0f} | {r['metrics_s']:.3f} | {r.get('render_s', 0.0):.3f} | {r.get('rules_s', 0.0):.2f} | "
                     f"{r.get('load', 0.0):.1f} | {ratios} | {to_base} |")
        last[r["mode"]] = r
    return "\n".join(lines)


def verdicts(rows: list[dict]) -> list[str]:
    """PASS / OVER lines for the targets of the sizes measured."""
    out = [f"FAILED: {r['workloads']} workloads ({r['mode']}): {r['error']}" for r in rows if "error" in r]
    rows = [r for r in rows if "error" not in r]
    for r in rows:
        target = TARGETS.get(r["workloads"])
        if target is not None:
            out.append(f"{'PASS' if r['cycle_s'] <= target else 'OVER'}: {r['workloads']} workloads ({r['mode']}) "
                       f"{r['cycle_s']:.2f} s a cycle (target <= {target:g} s)")
        for what, value, most in (("RSS", r["rss_mb"], 300), ("/metrics", r["metrics_s"], 1.0)):
            if value > most:
                out.append(f"OVER: {r['workloads']} workloads ({r['mode']}) {what} {value:.2f} (target <= {most})")
    for mode in {r["mode"] for r in rows}:
        counts = {round(r["queries"], 1) for r in rows if r["mode"] == mode}
        out.append(f"{'PASS' if len(counts) == 1 else 'OVER'}: queries per cycle ({mode}) "
                   f"{', '.join(f'{c:g}' for c in sorted(counts))} at every size (target: the same)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10,100,1000,5000", help="comma-separated workload counts")
    parser.add_argument("--pods-per-workload", type=int, default=4)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--history-seconds", type=float, default=1800)
    parser.add_argument("--step-seconds", type=float, default=30)
    parser.add_argument("--modes", default="pods,recorded,own", help="pods (activations_query), recorded "
                        "(recorded_series too), own (an activation query per workload), baseline (own, with the "
                        "code of --baseline), base-pods and base-recorded (pods and recorded with the code and rules "
                        "of --baseline)")
    parser.add_argument("--baseline", type=Path, help="a checkout of another revision, run as modes baseline, "
                        "base-pods and base-recorded")
    parser.add_argument("--workdir", type=Path, help="keep the TSDBs here, and use them again in a later run (for "
                        "two hours, with the same sizes and history)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--measure-one", nargs=3, metavar=("CONFIG", "PROMETHEUS", "CYCLES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_one:
        config, url, cycles = args.measure_one
        print(json.dumps(measure_one(config, url, int(cycles))))
        return 0
    rows = run([int(x) for x in args.sizes.split(",")], args.pods_per_workload, args.cycles, args.history_seconds,
               args.step_seconds, tuple(m for m in args.modes.split(",") if m), args.workdir,
               args.baseline)
    print(table(rows))
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on "
          f"{os.cpu_count()} CPUs")
    if args.json:
        print(json.dumps(rows))
    lines = verdicts(rows)
    print("\n".join(lines))
    return 1 if args.check and any(line.startswith(("OVER", "FAILED")) for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
