"""A real Prometheus scrapes the exporter's HTTPS (``tls_cert_file``, ``tls_key_file``): with ``scheme: https``
and the certificate as its ``ca_file`` the target is up and its samples stored, gzip-compressed on the way;
a scrape over plain HTTP, or trusting another certificate, is down, and the trusted one stays up."""

from __future__ import annotations

import gzip
import json
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
from prometheus_client import Gauge, generate_latest
from prometheus_client.registry import CollectorRegistry

from dprobe.services.exporter import ExporterServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a real Prometheus: seconds
SERIES = 200  # a page over the gzip threshold


class Ready:
    def ready(self) -> tuple[bool, str]:
        return True, "ok"


def make_certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (RSA, 1 day), as (cert, key) under ``directory``."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def query(base: str, promql: str) -> list[dict]:
    """``/api/v1/query`` result (a vector) of ``promql``."""
    with urllib.request.urlopen(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=5) as r:
        doc = json.load(r)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


@contextmanager
def scraping_prometheus(binary: str, port: int, workdir: Path, jobs: list[dict]) -> Iterator[str]:
    """Prometheus on 127.0.0.1:``port`` with ``jobs`` as its scrape configs (every second); yields its URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                                   "scrape_configs": jobs}))
    log = (workdir / "prometheus.log").open("w")
    proc = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while True:
            assert proc.poll() is None, (workdir / "prometheus.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(base + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, "prometheus did not become ready in time"
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_prometheus_scrapes_the_exporter_over_https(tmp_path: Path, free_port: Callable[[], int],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Prometheus with the certificate as its CA scrapes the page (gzipped); over HTTP or with another CA it
    cannot, and those refusals do not stop the trusted scrapes."""
    binary = shutil.which("prometheus") or shutil.which("/usr/bin/prometheus")
    if binary is None:
        pytest.skip("no prometheus binary on PATH (apt-get install prometheus)")
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make the test certificate")
    cert, key = make_certificate(tmp_path, "server")
    other, _ = make_certificate(tmp_path, "other")
    registry = CollectorRegistry(auto_describe=False)
    gauge = Gauge("dprobe_tls_test_value", "A value served over HTTPS.", ["target"], registry=registry)
    for i in range(SERIES):
        gauge.labels(f"ns/pod-{i}").set(i)
    served: list[str] = []
    compress = gzip.compress

    def render(reg: CollectorRegistry) -> bytes:
        served.append("page")
        return generate_latest(reg)

    def compressed(data: bytes, compresslevel: int = 9) -> bytes:
        served.append("gzip")
        return compress(data, compresslevel=compresslevel)

    monkeypatch.setattr(gzip, "compress", compressed)

    srv = ExporterServer(registry, Ready(), "127.0.0.1", 0, fast=render, tls_cert_file=str(cert),
                         tls_key_file=str(key))
    srv.start()
    target = [{"targets": [f"127.0.0.1:{srv.port}"]}]
    jobs = [{"job_name": "https", "scheme": "https", "tls_config": {"ca_file": str(cert)}, "static_configs": target},
            {"job_name": "plain", "scheme": "http", "static_configs": target},
            {"job_name": "other-ca", "scheme": "https", "tls_config": {"ca_file": str(other)},
             "static_configs": target}]
    try:
        with scraping_prometheus(binary, free_port(), tmp_path / "prometheus", jobs) as prom:
            deadline = time.time() + 30
            while True:
                up = {r["metric"]["job"]: r["value"][1] for r in query(prom, "up")}
                stored = query(prom, 'count(dprobe_tls_test_value{job="https"})')
                if len(up) == 3 and stored and int(stored[0]["value"][1]) == SERIES:
                    break
                assert time.time() < deadline, (up, stored, (tmp_path / "prometheus" / "prometheus.log").read_text())
                time.sleep(0.3)
            assert up == {"https": "1", "plain": "0", "other-ca": "0"}, up
            assert query(prom, 'dprobe_tls_test_value{job="https",target="ns/pod-7"}')[0]["value"][1] == "7"
            assert not query(prom, 'dprobe_tls_test_value{job!="https"}')
            assert srv.httpd.tls_failures >= 2  # the plain and the other-CA scrapes, refused
            scraped = len(served)
            time.sleep(2.5)  # the trusted scrape carries on beside the refused ones
            assert len(served) >= scraped + 1
            assert served.count("gzip") >= served.count("page") - 1  # each page gzipped, as Prometheus asks
            assert {r["metric"]["job"]: r["value"][1] for r in query(prom, "up")} == up
            size = query(prom, 'scrape_samples_scraped{job="https"}')
            assert int(size[0]["value"][1]) >= SERIES
    finally:
        srv.stop()
