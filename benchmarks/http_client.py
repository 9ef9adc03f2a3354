"""HTTP client benchmark: Prometheus queries as the scaler and the sidecar make them, on kept-alive connections
against a new connection per query.

    python benchmarks/http_client.py [--queries 200] [--repeat 3] [--schemes http,https] [--baseline-ref REF]

A real Prometheus is started on loopback (scraping itself, so that ``up`` has a series; with ``https``, a second
one serving TLS with a throwaway certificate made by openssl). Each mode then runs ``--queries`` instant
queries through ``dprobe.services.sources.prometheus.query_vector`` (the scaler's query path) with the
scaler's default ``http_timeout``:

- ``pooled``: dprobe's client as it runs, its connections kept alive from one query to the next;
- ``fresh``: the same client with its pool emptied before each query (a new TCP connection, and TLS handshake,
  per query: what the client did before it kept connections);
- ``urllib``: the standard library's ``urllib.request.urlopen`` and ``json.loads``, a new connection per query;
- ``baseline``: with ``--baseline-ref REF``, the client of revision REF (``git show REF:dprobe/services/sources/
  http.py``) in query_vector's place; its lines of code are printed beside this one's.

Printed per scheme and mode (the median of ``--repeat`` runs, modes interleaved so that load drifts alike):
ms per query (p50, p99), client CPU ms per query, the connections Prometheus accepted over the timed queries
(its ``net_conntrack_listener_conn_accepted_total``; a warm-up query goes first) and the ratio of the p50 to
``pooled``'s. ``fresh`` pays for new pools too (emptying the pool drops them), so ``baseline`` is the fairer
figure for the client before.

Target: no new connection over the timed queries (the warm-up query's one kept alive), and ``pooled`` not
slower than ``fresh``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import types
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from dprobe.services.scaler.config import ScalerConfig
from dprobe.services.sources import http, prometheus
from dprobe.services.sources.http import HttpAuth

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prometheus_process import free_port, running  # noqa: E402  (benchmarks/prometheus_process.py)

ROOT = Path(__file__).resolve().parent.parent
MODULE = "dprobe/services/sources/http.py"


def certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (openssl, EC P-256)."""
    cert, key = directory / "server.crt", directory / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@contextlib.contextmanager
def run_prometheus(workdir: Path, tls: tuple[Path, Path] | None = None) -> Iterator[str]:
    """A Prometheus on loopback scraping itself every second (TLS with ``tls``); yields its base URL once ``up``
    has a value."""
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not os.path.exists(binary):
        raise SystemExit("no prometheus binary on PATH (apt-get install prometheus)")
    workdir.mkdir(parents=True)
    port = free_port()
    scheme = "https" if tls else "http"
    job: dict[str, Any] = {"job_name": "prometheus", "scheme": scheme, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
    if tls:
        job["tls_config"] = {"ca_file": str(tls[0])}
    (workdir / "prometheus.yml").write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"},
                                                            "scrape_configs": [job]}))
    args = [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}"]
    if tls:
        (workdir / "web.yml").write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(tls[0]),
                                                                               "key_file": str(tls[1])}}))
        args.append(f"--web.config.file={workdir / 'web.yml'}")
    base = f"{scheme}://127.0.0.1:{port}"
    context = ssl.create_default_context(cafile=str(tls[0])) if tls else None

    def answers_up() -> bool:
        with contextlib.suppress(KeyError, ValueError), urllib.request.urlopen(
                base + "/api/v1/query?query=up", timeout=1, context=context) as r:
            return bool(json.load(r)["data"]["result"])
        return False

    with running(args, workdir / "prometheus.log", answers_up, 60, "prometheus did not answer a query for up in time"):
        yield base


def accepted(base: str, context: ssl.SSLContext | None) -> float:
    """Connections Prometheus has accepted on its web listener (this read's own included)."""
    with urllib.request.urlopen(base + "/metrics", timeout=5, context=context) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("net_conntrack_listener_conn_accepted_total") and 'listener_name="http"' in line:
                return float(line.rsplit(" ", 1)[1])
    return float("nan")


def load_baseline(ref: str) -> tuple[types.ModuleType, str]:
    """The HTTP client module of git revision ``ref``, loaded under its own name, and its source."""
    source = subprocess.run(["git", "show", f"{ref}:{MODULE}"], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout
    path = Path(tempfile.mkdtemp()) / "http_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("http_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, source


def code_lines(source: str) -> tuple[int, int]:
    """(all lines, lines of code: not blank, not a comment, not in a docstring)."""
    lines = source.splitlines()
    code, in_doc = 0, False
    for line in lines:
        text = line.strip()
        quotes = text.count('"""')
        if in_doc:
            in_doc = quotes % 2 == 0
            continue
        if text.startswith('"""'):
            in_doc = quotes == 1
            continue
        if text and not text.startswith("#"):
            code += 1
    return len(lines), code


def urllib_query(base: str, timeout: float, context: ssl.SSLContext | None) -> list:
    """An instant query with the standard library: a new connection each time."""
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': 'up'})}"
    with urllib.request.urlopen(url, timeout=timeout, context=context) as r:
        return json.load(r)["data"]["result"]


def measure(query: Callable[[], object], n: int, base: str, context: ssl.SSLContext | None) -> dict:
    """``n`` calls of ``query``: per-call wall ms (p50, p99), client CPU ms per call, connections accepted."""
    query()  # warm: imports, first connection
    before = accepted(base, context)
    walls = []
    cpu = time.process_time()
    for _ in range(n):
        t = time.perf_counter()
        query()
        walls.append((time.perf_counter() - t) * 1000)
    cpu = (time.process_time() - cpu) * 1000 / n
    walls.sort()
    return {"p50": statistics.median(walls), "p99": walls[min(n - 1, int(0.99 * n))], "cpu": cpu,
            "connections": accepted(base, context) - before - 1}  # less the read of /metrics before


def modes(base: str, timeout: float, ca: Path | None, baseline: types.ModuleType | None
          ) -> dict[str, Callable[[], object]]:
    auth = HttpAuth(ca_file=str(ca) if ca else "", prefix="prometheus_")
    context = ssl.create_default_context(cafile=str(ca)) if ca else None

    def pooled() -> object:
        return prometheus.query_vector(base, "up", timeout, auth)

    def fresh() -> object:
        auth.close()
        http._PLAIN.close()  # the client of requests without credentials or TLS settings
        return prometheus.query_vector(base, "up", timeout, auth)

    out: dict[str, Callable[[], object]] = {"pooled": pooled, "fresh": fresh,
                                             "urllib": lambda: urllib_query(base, timeout, context)}
    if baseline is not None:
        old_auth = baseline.HttpAuth(ca_file=str(ca) if ca else "", prefix="prometheus_")

        def old() -> object:
            with _patched(prometheus, "http_get", baseline.http_get):
                return prometheus.query_vector(base, "up", timeout, old_auth)

        out["baseline"] = old
    return out


@contextlib.contextmanager
def _patched(module: types.ModuleType, name: str, value: object) -> Iterator[None]:
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def run(schemes: list[str], n: int, repeat: int, baseline: types.ModuleType | None) -> list[dict]:
    timeout = ScalerConfig().queries.http_timeout  # the scaler's default
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for scheme in schemes:
            tls = certificate(Path(tmp)) if scheme == "https" else None
            with run_prometheus(Path(tmp) / scheme, tls) as base:
                context = ssl.create_default_context(cafile=str(tls[0])) if tls else None
                calls = modes(base, timeout, tls[0] if tls else None, baseline)
                runs: dict[str, list[dict]] = {mode: [] for mode in calls}
                for _ in range(repeat):
                    for mode, call in calls.items():
                        runs[mode].append(measure(call, n, base, context))
                for mode, results in runs.items():
                    rows.append({"scheme": scheme, "mode": mode, "queries": n, **{
                        key: statistics.median(r[key] for r in results) for key in results[0]}})
    return rows


def table(rows: list[dict]) -> str:
    out = [f"{'scheme':6} {'mode':9} {'p50 ms':>7} {'p99 ms':>7} {'CPU ms':>7} {'conns':>6} {'p50 / pooled':>12}"]
    for row in rows:
        pooled = next(r for r in rows if r["scheme"] == row["scheme"] and r["mode"] == "pooled")
        out.append(f"{row['scheme']:6} {row['mode']:9} {row['p50']:7.2f} {row['p99']:7.2f} {row['cpu']:7.2f} "
                   f"{row['connections']:6.0f} {row['p50'] / pooled['p50']:12.2f}")
    return "\n".join(out)


def verdicts(rows: list[dict]) -> list[str]:
    lines = []
    for scheme in dict.fromkeys(r["scheme"] for r in rows):
        by = {r["mode"]: r for r in rows if r["scheme"] == scheme}
        pooled, fresh = by["pooled"], by["fresh"]
        ok = pooled["connections"] == 0 and pooled["p50"] <= fresh["p50"]
        lines.append(f"{'PASS' if ok else 'OVER'} {scheme}: {pooled['connections']:.0f} new connections over "
                     f"{pooled['queries']} queries (target 0: the warm-up query's kept alive); p50 "
                     f"{pooled['p50']:.2f} ms, {fresh['p50']:.2f} ms with a new connection per query")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=200, help="queries per mode and run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode (the median is printed)")
    parser.add_argument("--schemes", default="http,https", help="http, https or both (https needs openssl)")
    parser.add_argument("--baseline-ref", help="a git revision whose client runs as mode baseline")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    schemes = [s for s in args.schemes.split(",") if s]
    if bad := set(schemes) - {"http", "https"}:
        parser.error(f"--schemes: {', '.join(sorted(bad))} is neither http nor https")
    if "https" in schemes and shutil.which("openssl") is None:
        parser.error("--schemes https needs openssl on PATH (for a throwaway certificate)")
    baseline = None
    if args.baseline_ref:
        try:
            baseline, source = load_baseline(args.baseline_ref)
        except subprocess.CalledProcessError as exc:
            parser.error(f"--baseline-ref {args.baseline_ref}: {exc.stderr.strip()}")
        for name, text in ((args.baseline_ref, source), ("this tree", (ROOT / MODULE).read_text())):
            total, code = code_lines(text)
            print(f"{MODULE} at {name}: {total} lines, {code} of code (no blank, comment or docstring line)")
    rows = run(schemes, args.queries, args.repeat, baseline)
    print(table(rows))
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on "
          f"{os.cpu_count()} CPUs (timings on a shared machine are noisy: compare ratios within one run)")
    if args.json:
        print(json.dumps(rows))
    lines = verdicts(rows)
    print("\n".join(lines))
    return 1 if args.check and any(line.startswith("OVER") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
