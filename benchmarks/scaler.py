"""Scaler benchmark: one decision cycle for many pods, against the Prometheus queries it makes.

    python benchmarks/scaler.py [--pods 1000,10000] [--pods-per-workload 4] [--cycles 30] [--churn-cycles 300]

A stand-in Prometheus API on loopback answers the forecast, GPU-count and replicas (kube-state-metrics)
queries with ``--pods`` pods in Deployments of ``--pods-per-workload`` replicas across 20 namespaces (virtual clusters). Printed per
size: the cycle's p50 / p99 (query both, group, decide for every workload and virtual cluster), the
p50 of the two queries alone (HTTP + JSON, the floor any client pays), and their ratio.

Then a churn run: 1,000 pods whose Deployments are replaced, a tenth of them every cycle (new names, as
rollouts and short-lived services bring), for ``--churn-cycles`` cycles: the workloads tracked and the
process's RSS at the start and the end (what is kept for workloads that are gone must not pile up).

Targets (dprobe's own: a cycle must fit well inside the default 30 s interval; unattended, it must
not grow): cycle p99 <= 1 s at 10,000 pods; RSS growth over the churn run < 5 %.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from process import rss_mb  # benchmarks/process.py

from dprobe.services.scaler.config import ScalerConfig
from dprobe.services.scaler.demand import forecast_query, pod_forecasts, pod_gpus
from dprobe.services.scaler.service import Scaler


def fleet(n_pods: int, per_workload: int, generation: int = 0, namespaces: int = 20
          ) -> list[tuple[str, str, str, float, int]]:
    """``n_pods`` pods in Deployments of ``per_workload`` replicas across ``namespaces`` namespaces (virtual
    clusters): ``(namespace, deployment, pod, p90 utilisation forecast, GPUs)`` each, the same every call. Each
    ``generation`` replaces a tenth of the Deployments by new ones (new names)."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n_pods):
        k = i // per_workload
        renamed = max(0, generation - (generation - k) % 10)  # the last generation that replaced workload k
        ns, w = f"team-{k % namespaces}", f"svc-{k}-g{renamed}"
        out.append((ns, w, f"{w}-7d9f8c6b5d-{i:05d}", float(f"{rng.uniform(0.1, 1.0):.4f}"), 1 + i % 2))
    return out


def answers(n_pods: int, per_workload: int, generation: int = 0) -> dict[str, bytes]:
    """The two query answers (forecasts, GPU counts) as a Prometheus server would give them; each
    ``generation`` replaces a tenth of the Deployments by new ones."""
    forecasts, gpus, replicas = [], [], {}
    for ns, w, pod, value, n_gpus in fleet(n_pods, per_workload, generation):
        labels = {"__name__": "dprobe_predicted_gpu_utilization_ratio", "target": f"{ns}/{pod}", "namespace": ns,
                  "pod": pod, "container": "main", "UUID": "", "gpu": "", "horizon_seconds": "300",
                  "quantile": "0.9", "instance": "10.0.0.1:9477", "job": "dprobe"}
        forecasts.append({"metric": labels, "value": [time.time(), f"{value:.4f}"]})
        gpus.append({"metric": {"namespace": ns, "pod": pod}, "value": [time.time(), str(n_gpus)]})
        replicas[ns, w] = replicas.get((ns, w), 0) + 1

    def doc(result: list) -> bytes:
        return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()

    counts = [{"metric": {"namespace": ns, "workload": w}, "value": [time.time(), str(n)]}
              for (ns, w), n in replicas.items()]  # kube-state-metrics' spec replicas: where a count starts
    return {"forecast": doc(forecasts), "gpus": doc(gpus), "replicas": doc(counts), "none": doc([])}


def _answer(query: str) -> str:
    """Which answer a query gets: forecasts, replicas (kube-state-metrics), GPU counts, or nothing (the
    restore queries of the scaler's own series, owners: grouped by name)."""
    if "dprobe_predicted" in query:
        return "forecast"
    if "kube_deployment_spec_replicas" in query:
        return "replicas"
    if "DCGM_FI_DEV_GPU_UTIL" in query:
        return "gpus"
    return "none"


class _Prometheus(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = self.server.answers[_answer(urllib.parse.unquote_plus(self.path))]  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", default="1000,10000", help="comma-separated pod counts")
    parser.add_argument("--pods-per-workload", type=int, default=4)
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--churn-cycles", type=int, default=300)
    args = parser.parse_args()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    print("| pods | workloads | cycle p50 (ms) | cycle p99 (ms) | queries alone p50 (ms) | cycle / queries |")
    print("|---:|---:|---:|---:|---:|---:|")
    at_target = None  # cycle p99 at 10,000 pods
    for n in (int(x) for x in args.pods.split(",")):
        srv.answers = answers(n, args.pods_per_workload)  # type: ignore[attr-defined]
        config = ScalerConfig(prometheus_url=url, http_timeout=30)
        scaler = Scaler(config, clock=iter(range(0, 10**9, 30)).__next__)
        query_ms, cycle_ms = [], []
        for _ in range(args.cycles):
            t = time.perf_counter()
            pod_forecasts(config.queries)
            pod_gpus(config.queries)
            query_ms.append(1000 * (time.perf_counter() - t))
            t = time.perf_counter()
            scaler.cycle()
            cycle_ms.append(1000 * (time.perf_counter() - t))
        assert len(scaler.decisions) == -(-n // args.pods_per_workload) and len(scaler.vc_decisions) == 20
        q50, c50, c99 = np.median(query_ms), np.median(cycle_ms), np.percentile(cycle_ms, 99)
        print(f"| {n} | {len(scaler.decisions)} | {c50:.1f} | {c99:.1f} | {q50:.1f} | {c50 / q50:.2f} |")
        if n == 10000:
            at_target = c99
    print(f"\nquery: {forecast_query(ScalerConfig().queries)}")
    if at_target is not None:
        print(f"{'PASS' if at_target <= 1000 else 'OVER'}: cycle p99 at 10,000 pods {at_target:.0f} ms "
              "(target <= 1000 ms)")
    scaler = Scaler(ScalerConfig(prometheus_url=url, http_timeout=30), clock=iter(range(0, 10**9, 30)).__next__)
    tracked, rss = [], []
    for g in range(args.churn_cycles):
        srv.answers = answers(1000, args.pods_per_workload, g)  # type: ignore[attr-defined]
        scaler.cycle()
        tracked.append(len(scaler.workloads.recommenders) + len(scaler.events_total))
        if g == args.churn_cycles // 10:
            rss.append(rss_mb())  # after warm-up
    rss.append(rss_mb())
    growth = 100 * (rss[-1] / rss[0] - 1)
    print(f"churn: {args.churn_cycles} cycles, workloads + event series tracked {min(tracked)}-{max(tracked)}, "
          f"RSS {rss[0]:.0f} -> {rss[-1]:.0f} MB ({growth:+.1f} %)")
    print(f"{'PASS' if growth < 5 else 'OVER'}: RSS growth over the churn run {growth:+.1f} % (target < 5 %)")
    srv.shutdown()


if __name__ == "__main__":
    main()
