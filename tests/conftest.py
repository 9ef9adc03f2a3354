"""Shared fixtures: small copies of the bundled data sets, laid out exactly like the originals; the repository's
scripts as modules; loopback ports, HTTP peers, /metrics pages; pod annotations as the kubelet writes them."""

from __future__ import annotations

import gzip
import importlib.util
import os
import shutil
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

ROOT = Path(__file__).resolve().parent.parent
DATASETS = ROOT / "datasets"


@pytest.fixture(scope="session")
def small_alibaba_dir(tmp_path_factory) -> Path:
    """Four long-lived pods of alibaba-genai-2026 (all three files, same names and columns)."""
    src = DATASETS / "alibaba-genai-2026"
    out = tmp_path_factory.mktemp("alibaba-small")
    duty = pd.read_csv(src / "pod_gpu_duty_cycle_anon.csv.gz")
    counts = duty["container_ip"].value_counts()
    pods = sorted(counts[counts >= 1400].index)[:4]
    for name in ("pod_gpu_duty_cycle_anon", "pod_gpu_memory_used_bytes_anon", "qps"):
        df = pd.read_csv(src / f"{name}.csv.gz")
        keep = df["container_ip"].isin(pods) | (df["container_ip"].isna() if name == "qps" else False)
        df[keep].to_csv(out / f"{name}.csv.gz", index=False)
    shutil.copy(src / "LICENSE", out / "LICENSE")
    return out


@pytest.fixture(scope="session")
def small_helios_dir(tmp_path_factory) -> Path:
    """Two VCs of helios-earth-vc, their first four days, plus the quota file."""
    src = DATASETS / "helios-earth-vc"
    out = tmp_path_factory.mktemp("helios-small")
    for vc in sorted(p.name for p in src.glob("vc*.csv.gz"))[:2]:
        df = pd.read_csv(src / vc)
        df.head(4 * 24 * 60).to_csv(out / vc, index=False)
    shutil.copy(src / "Earth_gpu_number.csv", out / "Earth_gpu_number.csv")
    return out


@pytest.fixture(scope="session")
def small_h200_dir(tmp_path_factory) -> Path:
    """Eight h200-profiles runs of three small model families (quick to replay), all four files."""
    src = DATASETS / "h200-profiles"
    out = tmp_path_factory.mktemp("h200-small")
    keep = ["r014", "r061", "r062", "r019", "r071", "r023", "r077", "r078"]  # alexnet, shufflenet, squeezenet
    runs = pd.read_csv(src / "runs.csv")
    runs[runs["run_id"].isin(keep)].to_csv(out / "runs.csv", index=False)
    samples = pd.read_csv(src / "samples.csv")
    samples[samples["label"].isin(keep)].to_csv(out / "samples.csv", index=False)
    steps = pd.read_csv(src / "steps.csv")
    steps[steps["run_id"].isin(keep)].to_csv(out / "steps.csv", index=False)
    shutil.copy(src / "env.json", out / "env.json")
    return out


@pytest.fixture(scope="session")
def small_jobs_dir(tmp_path_factory) -> Path:
    """small_h200_dir's runs plus two of a family that the default split leaves for validation (ghostnet):
    a data set of whole jobs with training, validation and test families, quick to trace."""
    src = DATASETS / "h200-profiles"
    out = tmp_path_factory.mktemp("jobs-small")
    keep = ["r014", "r061", "r062", "r019", "r071", "r023", "r077", "r078", "r098", "r129"]
    for name, column in (("runs", "run_id"), ("samples", "label"), ("steps", "run_id")):
        table = pd.read_csv(src / f"{name}.csv")
        table[table[column].isin(keep)].to_csv(out / f"{name}.csv", index=False)
    shutil.copy(src / "env.json", out / "env.json")
    return out


AlibabaRows = dict[str, list[tuple[float, float, float]]]


def write_alibaba_layout(directory: Path, pods: AlibabaRows) -> Path:
    """An alibaba-genai-2026 layout: pod -> [(t seconds, duty %, memory bytes)] on the 57 s grid."""
    directory.mkdir(parents=True, exist_ok=True)
    duty = ["value,timestamp_anon,container_ip"]
    mem = ["value,timestamp_anon,container_ip"]
    for pod, rows in pods.items():
        for t, d, m in rows:
            duty.append(f"{d},{1_000_000 + t},{pod}")
            mem.append(f"{m},{1_000_000 + t},{pod}")
    for name, lines in (("pod_gpu_duty_cycle_anon", duty), ("pod_gpu_memory_used_bytes_anon", mem),
                        ("qps", ["timestamp_anon,value,container_ip,request_type", "1000000,1,,api"])):
        with gzip.open(directory / f"{name}.csv.gz", "wt") as f:
            f.write("\n".join(lines) + "\n")
    return directory


@pytest.fixture
def alibaba_layout() -> Callable[[Path, AlibabaRows], Path]:
    """Writes a small alibaba-genai-2026 directory from per-pod rows (see :func:`write_alibaba_layout`)."""
    return write_alibaba_layout


def load_script(path: str) -> ModuleType:
    """A script of the repository (``path`` relative to its root, e.g. ``benchmarks/forecast_headroom.py``),
    run as a module named after its file."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def script() -> Callable[[str], ModuleType]:
    """``script("benchmarks/forecast_headroom.py")``: see :func:`load_script`."""
    return load_script


@pytest.fixture()
def collector(tmp_path, monkeypatch):
    """tools/collect_gpu_profiles.py as a module, its log and output under ``tmp_path/out``."""
    monkeypatch.setenv("OUT", str(tmp_path / "out"))  # the module opens its log there on import
    module = load_script("tools/collect_gpu_profiles.py")
    yield module
    module.LOG.close()


def loopback_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    """``free_port()``: see :func:`loopback_port`."""
    return loopback_port


class _Peer(BaseHTTPRequestHandler):
    """A test peer on 127.0.0.1 answering with whatever ``server.reply(path)`` says: (code, body, delay)."""

    def do_GET(self) -> None:  # noqa: N802
        code, body, delay = self.server.reply(self.path)  # type: ignore[attr-defined]
        if delay:
            time.sleep(delay)
        data = body.encode() if isinstance(body, str) else body
        try:
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
            pass

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serve_http(reply: Callable[[str], tuple[int, str | bytes, float]]) -> Iterator[str]:
    """An HTTP server on loopback answering GETs with ``reply(path)``; yields its base URL."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Peer)
    srv.daemon_threads = True
    srv.reply = reply  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def http_peer() -> Callable:
    """``with http_peer(lambda path: (200, "text", 0.0)) as url:`` a peer such as a dcgm-exporter (see
    :func:`serve_http`)."""
    return serve_http


@contextmanager
def serve_dripping(reply: Callable[[str], tuple[str, str]], gap: float = 0.1, most: float = 5.0) -> Iterator[str]:
    """An HTTP server on loopback answering each GET with ``reply(path)``: (body, how), ``how`` being ``"now"``
    (the answer at once), ``"head"`` (the whole answer a byte every ``gap`` s, from its status line on) or
    ``"body"`` (the status line and headers at once, the body a byte every ``gap`` s). A dripped answer stops
    after ``most`` s, its connection closed, or once the client has gone; yields the base URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(most)
            request = b""
            while b"\r\n\r\n" not in request:
                data = conn.recv(4096)
                if not data:
                    return
                request += data
            body, how = reply(request.split(b" ", 2)[1].decode())
            data = body.encode()
            head = (f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(data)}\r\n"
                    "Connection: close\r\n\r\n").encode()
            now, drip = {"now": (head + data, b""), "head": (b"", head + data), "body": (head, data)}[how]
            ends = time.monotonic() + most
            try:
                conn.sendall(now)
                for i in range(len(drip)):
                    if stop.wait(gap) or time.monotonic() > ends:
                        return
                    conn.sendall(drip[i:i + 1])
            except OSError:  # the client gave up
                return

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        server.join(5)
        listener.close()


@pytest.fixture
def drip_peer() -> Callable:
    """``with drip_peer(lambda path: (text, "body")) as url:`` a peer that answers a byte at a time (see
    :func:`serve_dripping`)."""
    return serve_dripping


def scrape_samples(url: str, timeout: float = 5.0) -> list[Sample]:
    """The samples of the ``/metrics`` page of the server at ``url`` (its base URL), parsed as Prometheus
    parses them."""
    with urllib.request.urlopen(url + "/metrics", timeout=timeout) as r:
        text = r.read().decode()
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


@pytest.fixture(scope="session")
def scrape() -> Callable[..., list[Sample]]:
    """``scrape(url)``: see :func:`scrape_samples`."""
    return scrape_samples


def write_annotations(path: Path, text: str = "", **values: str) -> None:
    """A downward-API annotations file written as the kubelet writes it, a new file swapped in (new inode and
    mtime): ``text``, then a ``key="value"`` line for each of ``values``."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text + "".join(f'{key}="{value}"\n' for key, value in values.items()))
    tmp.replace(path)


@pytest.fixture(scope="session")
def annotate() -> Callable[..., None]:
    """``annotate(path, text)`` or ``annotate(path, **{key: value})``: see :func:`write_annotations`."""
    return write_annotations


# CI sets DPROBE_TESTS_NO_SKIP=1 (.ci/run installs Prometheus, promtool, the test extra): there, a test skipped for
# a missing tool fails instead, so that a broken install step cannot hide tests; only the GPU checks may skip
NO_SKIP = os.environ.get("DPROBE_TESTS_NO_SKIP") == "1"
MAY_SKIP = ("needs an NVIDIA GPU",)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if NO_SKIP and report.skipped and not any(reason in str(report.longrepr) for reason in MAY_SKIP):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (DPROBE_TESTS_NO_SKIP=1): {report.longrepr}"


@pytest.fixture(scope="session")
def console_script() -> str:
    """The installed ``dprobe`` command (``pip install -e '.[test]'`` puts it beside the interpreter)."""
    found = Path(sys.executable).parent / "dprobe"
    if found.exists():
        return str(found)
    on_path = shutil.which("dprobe")
    assert on_path, f"no dprobe console script beside {sys.executable} or on PATH: pip install -e '.[test]'"
    return on_path


@pytest.fixture(scope="session")
def make_certificate(tmp_path_factory) -> Callable[[str], tuple[Path, Path]]:
    """Factory: ``make_certificate(name)`` -> (cert, key), a self-signed certificate for 127.0.0.1 and its
    RSA key (PEM, 1 day), made with openssl (skips without it)."""
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("no openssl on PATH")
    directory = tmp_path_factory.mktemp("tls")

    def make(name: str = "server") -> tuple[Path, Path]:
        cert, key = directory / f"{name}.crt", directory / f"{name}.key"
        if not cert.exists():
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                            "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1", "-keyout", str(key),
                            "-out", str(cert)], check=True, capture_output=True)
        return cert, key

    return make
