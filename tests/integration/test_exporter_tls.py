"""A real Prometheus scrapes the exporter's HTTPS (``tls_cert_file``, ``tls_key_file``): with ``scheme: https``
and the certificate as its ``ca_file`` the target is up and its samples stored, gzip-compressed on the way;
a scrape over plain HTTP, or trusting another certificate, is down, and the trusted one stays up."""

from __future__ import annotations

import gzip
import time
from collections.abc import Callable

import pytest
from prometheus_client import Gauge, generate_latest
from prometheus_client.registry import CollectorRegistry

from dprobe.services.exporter import ExporterServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a real Prometheus: seconds
SERIES = 200  # a page over the gzip threshold


class Ready:
    def ready(self) -> tuple[bool, str]:
        return True, "ok"


def test_prometheus_scrapes_the_exporter_over_https(prometheus_server: Callable, make_certificate: Callable,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Prometheus with the certificate as its CA scrapes the page (gzipped); over HTTP or with another CA it
    cannot, and those refusals do not stop the trusted scrapes."""
    cert, key = make_certificate("server")
    other, _ = make_certificate("other")
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
        with prometheus_server([], scrape_configs=jobs) as prom:
            deadline = time.time() + 30
            while True:
                up = {r["metric"]["job"]: r["value"][1] for r in prom.query("up")}
                stored = prom.query('count(dprobe_tls_test_value{job="https"})')
                if len(up) == 3 and stored and int(stored[0]["value"][1]) == SERIES:
                    break
                assert time.time() < deadline, (up, stored)
                time.sleep(0.3)
            assert up == {"https": "1", "plain": "0", "other-ca": "0"}, up
            assert prom.query('dprobe_tls_test_value{job="https",target="ns/pod-7"}')[0]["value"][1] == "7"
            assert not prom.query('dprobe_tls_test_value{job!="https"}')
            assert srv.httpd.tls_failures >= 2  # the plain and the other-CA scrapes, refused
            scraped = len(served)
            time.sleep(2.5)  # the trusted scrape carries on beside the refused ones
            assert len(served) >= scraped + 1
            assert served.count("gzip") >= served.count("page") - 1  # each page gzipped, as Prometheus asks
            assert {r["metric"]["job"]: r["value"][1] for r in prom.query("up")} == up
            size = prom.query('scrape_samples_scraped{job="https"}')
            assert int(size[0]["value"][1]) >= SERIES
    finally:
        srv.stop()
