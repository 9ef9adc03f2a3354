"""A real Prometheus for integration tests: ``prometheus_server(scrape_targets)`` starts one on loopback."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

PROMETHEUS_CANDIDATES = ("prometheus", "/usr/bin/prometheus")


def find_prometheus() -> str | None:
    for name in PROMETHEUS_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def prom_query(base_url: str, query: str) -> list[dict]:
    """``/api/v1/query`` result (a vector) of ``query``."""
    url = f"{base_url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=5) as r:
        doc = json.load(r)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


class PrometheusHandle(str):
    """The server's base URL (a str) with ``query(promql)`` for instant queries."""

    def query(self, promql: str) -> list[dict]:
        return prom_query(str(self), promql)


@contextmanager
def run_prometheus(binary: str, port: int, workdir: Path, scrape_targets: list[str], scrape_interval: str = "1s",
                   timeout: float = 30.0, target_labels: dict[str, str] | None = None,
                   honor_labels: bool = False, rule_files: list[Path] | None = None,
                   scrape_configs: list[dict] | None = None) -> Iterator[PrometheusHandle]:
    """Start Prometheus on loopback ``port``, scraping ``scrape_targets`` (host:port), and yield its base URL;
    stop it after.
    ``target_labels``: labels of the scrape target (as Kubernetes service discovery attaches the scraped
    pod's); ``honor_labels``: the scraped series' own labels win over them; ``rule_files``: recording and
    alerting rules it evaluates; ``scrape_configs``: Prometheus's own scrape configs instead of the one job
    (``scrape_targets`` then unused), each scraped every ``scrape_interval``."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": [str(Path(r).resolve()) for r in rule_files or []],
        "scrape_configs": [{"job_name": "dprobe", "scrape_interval": scrape_interval,
                            "scrape_timeout": scrape_interval, "honor_labels": honor_labels,
                            "static_configs": [{"targets": scrape_targets, "labels": target_labels or {}}]}],
    }
    if scrape_configs is not None:
        config["scrape_configs"] = [{"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval, **job}
                                    for job in scrape_configs]
    cfg = workdir / "prometheus.yml"
    cfg.write_text(yaml.safe_dump(config))
    log = (workdir / "prometheus.log").open("w")
    proc = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {proc.returncode}: "
                                   f"{(workdir / 'prometheus.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(base + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("prometheus did not become ready in time")
            time.sleep(0.1)
        yield PrometheusHandle(base)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def prometheus_server(tmp_path: Path, free_port: Callable[[], int]) -> Callable:
    """Factory: ``with prometheus_server(["127.0.0.1:9477"]) as base_url: ...`` (skips without the binary)."""
    binary = find_prometheus()
    if binary is None:
        pytest.skip("no prometheus binary on PATH (apt-get install prometheus)")
    counter = iter(range(1000))

    def start(scrape_targets: list[str], scrape_interval: str = "1s", **kw):
        return run_prometheus(binary, free_port(), tmp_path / f"prometheus-{next(counter)}", scrape_targets,
                              scrape_interval, **kw)

    return start


def _check_dashboard(prom: PrometheusHandle, path: Path, values: dict[str, str], timeout: float = 75) -> None:
    """Every query of the Grafana dashboard at ``path``, its variables set to ``values`` as Grafana would
    (``$__rate_interval`` as 1m), answers on this Prometheus, each variable's query lists its value, and
    each panel shows data (waiting up to ``timeout`` s for forecasts shifted by their horizon, or a
    subquery's minute marks)."""
    board = json.loads(path.read_text())
    values = {**values, "__rate_interval": "1m"}
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":  # label_values(SELECTOR, LABEL): the selector's series carry LABEL
            selector, label = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["definition"]).groups()
            found = {r["metric"].get(label) for r in prom.query(re.sub(r"\$(\w+)", ".*", selector))}
            assert values[variable["name"]] in found | {".*"}, (variable["name"], found)
    deadline = time.time() + timeout
    for panel in (p for p in board["panels"] if p["type"] != "row"):
        for target in panel["targets"]:
            expr = re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], target["expr"])
            while not (result := prom.query(expr)) and time.time() < deadline:
                time.sleep(1)
            assert result, (panel["title"], expr)


@pytest.fixture
def check_dashboard() -> Callable[..., None]:
    """``check_dashboard(prom, path, {"namespace": ".*", ...})``: see :func:`_check_dashboard`."""
    return _check_dashboard
