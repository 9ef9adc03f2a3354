"""The sidecar's Prometheus source and the scaler against a real Prometheus that wants TLS with a client
certificate (mTLS) and basic auth (``--web.config.file``): the right credentials read data; wrong or missing
ones, or a server certificate nobody said to trust, are clear errors, counted, never an empty read."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import bcrypt
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dprobe.forecaster.loading import open_forecaster
from dprobe.services.scaler.config import ScalerConfig
from dprobe.services.scaler.service import Scaler
from dprobe.services.sidecar.config import SidecarConfig
from dprobe.services.sidecar.service import Sidecar
from dprobe.services.sources.base import SourceError
from dprobe.services.sources.prometheus import PrometheusSource

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a real Prometheus: seconds per test

USER, PASSWORD = "dprobe", "s3cret-pass"
PODS = ("llm-7d9f8c6b5d-aaaaa", "llm-7d9f8c6b5d-bbbbb")
SERIES = "".join(
    f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="GPU-{i}",namespace="serving",pod="{pod}"}} 60\n'
    f'DCGM_FI_DEV_FB_USED{{gpu="{i}",UUID="GPU-{i}",namespace="serving",pod="{pod}"}} 1000\n'
    f'dprobe_predicted_gpu_utilization_ratio{{target="serving/{pod}",namespace="serving",pod="{pod}",'
    f'horizon_seconds="300",quantile="0.9"}} 0.9\n'
    for i, pod in enumerate(PODS))


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate signed by it (EC keys, 1 day)."""
    d.mkdir(parents=True, exist_ok=True)
    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=dprobe test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        (d / f"{name}.ext").write_text(ext)
        _openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext", cwd=d)


@contextmanager
def secured_prometheus(binary: str, port: int, workdir: Path, target: str) -> Iterator[str]:
    """Prometheus on https://127.0.0.1:``port`` wanting a client certificate of the test CA and basic auth,
    scraping ``target`` every second; yields its URL."""
    pki = workdir / "pki"
    make_pki(pki)
    web = {"tls_server_config": {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key"),
                                 "client_auth_type": "RequireAndVerifyClientCert",
                                 "client_ca_file": str(pki / "ca.crt")},
           "basic_auth_users": {USER: bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()}}
    (workdir / "web.yml").write_text(yaml.safe_dump(web))
    (workdir / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "peer", "scrape_interval": "1s", "honor_labels": True,
                            "static_configs": [{"targets": [target]}]}]}))
    log = (workdir / "prometheus.log").open("w")
    proc = subprocess.Popen([binary, f"--config.file={workdir / 'prometheus.yml'}",
                             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             f"--web.config.file={workdir / 'web.yml'}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    auth = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    try:
        deadline = time.time() + 30
        while True:  # ready, and the target scraped: the first query that finds the series
            assert proc.poll() is None, (workdir / "prometheus.log").read_text()[-2000:]
            try:
                req = urllib.request.Request(url + "/api/v1/query?query=DCGM_FI_DEV_GPU_UTIL",
                                             headers={"Authorization": auth})
                with urllib.request.urlopen(req, timeout=2, context=ctx) as r:
                    if b'"pod"' in r.read():
                        break
            except OSError:
                pass
            assert time.time() < deadline, "the secured Prometheus never answered with the scraped series"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class _Series(BaseHTTPRequestHandler):
    """The scrape target: :data:`SERIES` on every GET."""

    def do_GET(self) -> None:  # noqa: N802
        body = SERIES.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def secured(tmp_path_factory, free_port) -> Iterator[tuple[str, Path]]:
    """(URL of the secured Prometheus, its PKI directory holding ``password`` too), one for the module."""
    tmp_path = tmp_path_factory.mktemp("secured-prometheus")
    binary = shutil.which("prometheus") or shutil.which("/usr/bin/prometheus")
    if binary is None:
        pytest.skip("no prometheus binary on PATH (apt-get install prometheus)")
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make the test certificates")
    peer = ThreadingHTTPServer(("127.0.0.1", 0), _Series)
    threading.Thread(target=peer.serve_forever, daemon=True).start()
    try:
        with secured_prometheus(binary, free_port(), tmp_path, f"127.0.0.1:{peer.server_address[1]}") as url:
            (tmp_path / "pki" / "password").write_text(PASSWORD + "\n")  # a trailing newline, as `echo` writes
            (tmp_path / "pki" / "wrong").write_text("not-the-password")
            yield url, tmp_path / "pki"
    finally:
        peer.shutdown()
        peer.server_close()


def _access(pki: Path, password: str | None = "password", ca: bool = True, client_cert: bool = True) -> dict:
    """The ``prometheus_*`` options of a client of the secured Prometheus."""
    out: dict = {"prometheus_ca_file": str(pki / "ca.crt") if ca else ""}
    if password:
        out |= {"prometheus_username": USER, "prometheus_password_file": str(pki / password)}
    if client_cert:
        out |= {"prometheus_cert_file": str(pki / "client.crt"), "prometheus_key_file": str(pki / "client.key")}
    return out


def _sidecar(url: str, access: dict) -> Sidecar:
    config = SidecarConfig(source="prometheus", prometheus_url=url, listen_address="127.0.0.1", port=0,
                           sample_interval=1, step_seconds=1, window_seconds=30, horizons=[5], min_points=2,
                           http_timeout=5, model="ewma", **access)
    return Sidecar(config, model=open_forecaster(None, "ewma"))


def _source_errors(sidecar: Sidecar) -> float:
    text = generate_latest(sidecar.registry).decode()
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "dprobe_source_errors_total" and s.labels.get("source") == "prometheus")


def test_sidecar_reads_the_secured_prometheus_with_its_credentials(secured) -> None:
    url, pki = secured
    sidecar = _sidecar(url, _access(pki))
    assert sidecar.pollers[0].poll_once(), sidecar.pollers[0].last_error
    assert set(sidecar.store.targets()) == {f"serving/{p}" for p in PODS}
    latest = sidecar.store.snapshot_latest()
    assert latest[f"serving/{PODS[0]}"].memory_bytes == 1000 * 1048576  # the sidecar's default query: MiB -> bytes
    assert _source_errors(sidecar) == 0
    # the same Prometheus without credentials: refused, not an empty answer
    with pytest.raises(SourceError, match="HTTP 401"):
        PrometheusSource(url, auth=SidecarConfig(**_access(pki, password=None)).prometheus_auth()).poll()


@pytest.mark.parametrize(("access", "message"), [
    ({"password": "wrong"}, r"HTTP 401 Unauthorized: the server wants credentials, basic auth given"),
    ({"password": None}, r"HTTP 401 Unauthorized: the server wants credentials, no credentials given"),
    ({"ca": False}, r"certificate was not verified .*set prometheus_ca_file to the CA that signed it"),
    ({"client_cert": False}, r"TLS: the server refused the client certificate .*prometheus_cert_file"),  # the server wants a client certificate (mTLS)
])
def test_sidecar_counts_refused_credentials_as_source_errors(secured, access: dict, message: str) -> None:
    url, pki = secured
    sidecar = _sidecar(url, _access(pki, **access))
    poller = sidecar.pollers[0]
    assert not poller.poll_once() and not poller.poll_once()
    assert _source_errors(sidecar) == 2
    assert sidecar.store.targets() == []
    with pytest.raises(SourceError, match=message):
        sidecar.sources[0].poll()


def test_scaler_reads_the_secured_prometheus_and_fails_clearly_without_credentials(secured) -> None:
    url, pki = secured
    workloads = [{"namespace": "serving", "name": "llm", "max_replicas": 8}]
    common = dict(prometheus_url=url, listen_address="127.0.0.1", port=0, target=0.5, margin=0.0, gpus_query="",
                  restore_seconds=0, workloads=workloads)
    scaler = Scaler(ScalerConfig(**common, **_access(pki)))
    scaler.cycle()
    decision = scaler.decisions[("serving", "llm")]
    assert decision.demand == pytest.approx(1.8) and scaler.errors_total["query"] == 0 and scaler.ready()[0]

    for access, message in (({"password": "wrong"}, "HTTP 401"), ({"ca": False}, "prometheus_ca_file")):
        scaler = Scaler(ScalerConfig(**common, **_access(pki, **access)))
        scaler.cycle()
        ready, why = scaler.ready()
        assert not ready and message in why and scaler.errors_total["query"] >= 1
        decision = scaler.decisions[("serving", "llm")]
        assert decision.demand is None and not decision.published  # no forecast: nothing shown, no zero
        metrics = generate_latest(scaler.registry).decode()
        assert "dprobe_recommended_replicas{" not in metrics
