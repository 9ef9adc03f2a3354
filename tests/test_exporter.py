"""The exporter: what /metrics shows (fresh vs stale), probes, and scrape speed."""

from __future__ import annotations

import gzip
import http.client
import logging
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from dprobe.services.exporter import ExporterServer
from dprobe.services.sidecar.collector import SidecarCollector
from dprobe.services.sidecar.state import ForecastSnapshot, JobRow, Latest, SourceStatus

NOW = 10_000.0


class FakeState:
    stale_after = 30.0
    forecast_max_age = 60.0

    def __init__(self, n: int = 3, snapshot_age: float = 5.0) -> None:
        self.targets = [f"ns/pod-{i}" for i in range(n)]
        labels = [{"namespace": "ns", "pod": f"pod-{i}", "container": "train", "gpu": str(i % 8), "UUID": f"GPU-{i}"}
                  for i in range(n)]
        self.latest = {t: Latest(NOW - 1.0, 1e9 * (i + 1), 0.25, "fake", labels[i]) for i, t in enumerate(self.targets)}
        self.jobs: list[JobRow] = []
        q = np.arange(n * 3 * 3, dtype=float).reshape(n, 3, 3)
        self.snap = ForecastSnapshot(made_at=NOW - snapshot_age, targets=tuple(self.targets),
                                     input_ts=np.full(n, NOW - 1.0), horizons=(60, 300, 900),
                                     levels=(0.5, 0.9, 0.99),
                                     quantiles={"gpu_memory_bytes": q * 1e9, "gpu_utilization_ratio": q / 100},
                                     labels=tuple(labels))
        self.is_ready = (False, "no sample yet")

    def forecast_snapshot(self):
        return self.snap

    def latest_samples(self):
        return dict(self.latest)

    def source_status(self):
        return [SourceStatus("dcgm", False, 7)]

    def forecast_errors(self) -> int:
        return 2

    def model_labels(self):
        return {"version": "0.1.0", "checkpoint": "/ckpt/model.pt", "kind": "dprobe-gnn"}

    def job_rows(self, latest, fresh):
        return [r for r in self.jobs if r.target in fresh]

    def ready(self):
        return self.is_ready


def scrape(state: FakeState) -> dict[str, list]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SidecarCollector(state, clock=lambda: NOW))
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_metric_names_labels_and_values() -> None:
    m = scrape(FakeState())
    mem = m["dprobe_predicted_gpu_memory_bytes"]
    assert len(mem) == 3 * 3 * 3
    assert {tuple(sorted(s.labels)) for s in mem} == {
        ("UUID", "container", "gpu", "horizon_seconds", "namespace", "pod", "quantile", "target")}
    # each series carries its target's identity labels, as the source gave them (dcgm-exporter's names)
    assert {(s.labels["target"], s.labels["namespace"], s.labels["pod"], s.labels["UUID"]) for s in mem} == {
        (f"ns/pod-{i}", "ns", f"pod-{i}", f"GPU-{i}") for i in range(3)}
    assert {s.labels["pod"]: s.labels["gpu"] for s in m["dprobe_observed_gpu_memory_bytes"]} == {
        "pod-0": "0", "pod-1": "1", "pod-2": "2"}
    assert {s.labels["horizon_seconds"] for s in mem} == {"60", "300", "900"}
    assert {s.labels["quantile"] for s in mem} == {"0.5", "0.9", "0.99"}
    one = {(s.labels["horizon_seconds"], s.labels["quantile"]): s.value for s in mem if s.labels["target"] == "ns/pod-1"}
    assert one[("300", "0.9")] == (9 + 3 + 1) * 1e9
    util = {s.labels["quantile"]: s.value for s in m["dprobe_predicted_gpu_utilization_ratio"]
            if s.labels["target"] == "ns/pod-0" and s.labels["horizon_seconds"] == "60"}
    assert util == {"0.5": 0.0, "0.9": 0.01, "0.99": 0.02}
    assert [s.value for s in m["dprobe_observed_gpu_memory_bytes"]] == [1e9, 2e9, 3e9]
    assert all(s.value == 0.25 for s in m["dprobe_observed_gpu_utilization_ratio"])
    assert all(s.value == pytest.approx(1.0) for s in m["dprobe_last_sample_age_seconds"])
    assert m["dprobe_source_errors_total"][0].labels == {"source": "dcgm"}
    assert m["dprobe_source_errors_total"][0].value == 7 and m["dprobe_source_up"][0].value == 0
    assert m["dprobe_forecast_errors_total"][0].value == 2
    assert m["dprobe_model_info"][0].labels == {"version": "0.1.0", "checkpoint": "/ckpt/model.pt",
                                                "kind": "dprobe-gnn"}


def test_stale_targets_and_old_forecasts_are_not_shown() -> None:
    state = FakeState()
    state.latest["ns/pod-1"] = Latest(NOW - 31.0, 5e9, 0.5, "fake")  # input stale
    state.snap.quantiles["gpu_memory_bytes"][2, 0, 0] = np.nan  # a NaN forecast is skipped
    m = scrape(state)
    assert {s.labels["target"] for s in m["dprobe_predicted_gpu_memory_bytes"]} == {"ns/pod-0", "ns/pod-2"}
    assert len(m["dprobe_predicted_gpu_memory_bytes"]) == 9 + 8
    assert "ns/pod-1" not in {s.labels["target"] for s in m["dprobe_observed_gpu_memory_bytes"]}
    age = {s.labels["target"]: s.value for s in m["dprobe_last_sample_age_seconds"]}
    assert age["ns/pod-1"] == pytest.approx(31.0)  # staleness is still reported
    m = scrape(FakeState(snapshot_age=61.0))  # the forecast loop stalled: nothing predicted shown
    assert "dprobe_predicted_gpu_memory_bytes" not in m and len(m["dprobe_observed_gpu_memory_bytes"]) == 3


JOB = JobRow("ns/pod-0", {"namespace": "ns", "pod": "pod-0"},
             {"gpu_memory_bytes": {"0.5": 5e9, "0.9": 6e9}, "step_seconds": {"0.5": 0.1, "0.9": 0.125}},
             {"model": "torchvision:resnet50", "batch": "64", "precision": "bf16", "fits": "yes"})


def test_job_profiles_are_exported_with_the_targets_identity() -> None:
    state = FakeState()
    state.jobs = [JOB]
    m = scrape(state)
    mem = {(s.labels["target"], s.labels["pod"], s.labels["quantile"]): s.value
           for s in m["dprobe_job_predicted_gpu_memory_bytes"]}
    assert mem == {("ns/pod-0", "pod-0", "0.5"): 5e9, ("ns/pod-0", "pod-0", "0.9"): 6e9}
    assert [s.value for s in m["dprobe_job_predicted_step_seconds"]] == [0.1, 0.125]
    [info] = m["dprobe_job_info"]
    assert (info.labels["model"], info.labels["batch"], info.labels["fits"], info.labels["optimizer"]) == (
        "torchvision:resnet50", "64", "yes", "")
    state.latest["ns/pod-0"] = Latest(NOW - 31.0, 5e9, 0.5, "fake")  # stale: its job's profile is withdrawn too
    assert "dprobe_job_info" not in scrape(state)


def test_power_clock_and_memory_total_are_observed_gauges_in_base_units() -> None:
    """The sources' further readings (a sample's extra) are exported as observed gauges with the target's
    identity, while fresh; a reading without an exported name is not."""
    state = FakeState()
    state.latest["ns/pod-0"] = replace(state.latest["ns/pod-0"], extra={
        "power_watts": 350.5, "sm_clock_hertz": 1.98e9, "memory_total_bytes": 80e9, "gpus": 1.0})
    m = scrape(state)
    power, clock, total = (m[n] for n in ("dprobe_observed_gpu_power_watts", "dprobe_observed_gpu_sm_clock_hertz",
                                          "dprobe_observed_gpu_memory_total_bytes"))
    assert [(s.labels["target"], s.labels["UUID"], s.value) for s in power] == [("ns/pod-0", "GPU-0", 350.5)]
    assert [s.value for s in clock] == [1.98e9] and [s.value for s in total] == [80e9]
    assert not [name for name in m if "gpus" in name]
    state.latest["ns/pod-0"] = replace(state.latest["ns/pod-0"], ts=NOW - 31.0)  # stale: withdrawn
    assert "dprobe_observed_gpu_power_watts" not in scrape(state)


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, "", e.read().decode()


def test_http_endpoints() -> None:
    state = FakeState()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SidecarCollector(state, clock=lambda: NOW))
    srv = ExporterServer(reg, state, "127.0.0.1", 0)
    srv.start()
    try:
        assert _get(srv.url + "/healthz")[0] == 200
        code, _, body = _get(srv.url + "/readyz")
        assert code == 503 and "no sample" in body
        state.is_ready = (True, "ok")
        assert _get(srv.url + "/readyz")[0] == 200
        code, ctype, body = _get(srv.url + "/metrics")
        assert code == 200 and ctype.startswith("text/plain") and "dprobe_predicted_gpu_memory_bytes{" in body
        req = urllib.request.Request(srv.url + "/metrics", headers={"Accept": "application/openmetrics-text"})
        with urllib.request.urlopen(req, timeout=2) as r:
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
            assert r.read().decode().rstrip().endswith("# EOF")
        assert _get(srv.url + "/nope")[0] == 404
    finally:
        srv.stop()


def _closed_by_server(conn: socket.socket, within: float) -> bool:
    """Whether the server closes ``conn`` (FIN or RST) within ``within`` s, sending nothing first."""
    conn.settimeout(within)
    try:
        return conn.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.mark.slow
def test_half_open_connections_are_dropped_and_threads_bounded() -> None:
    """Clients that open a connection and send nothing, or half a request, or a request a byte at a time,
    are dropped after request_timeout (in all, not per byte); while they hang, a scrape still answers; past
    max_connections a new connection is closed unanswered, and the threads go back to what they were."""
    state = FakeState()
    state.is_ready = (True, "ok")
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SidecarCollector(state, clock=lambda: NOW))
    srv = ExporterServer(reg, state, "127.0.0.1", 0, request_timeout=0.6, max_connections=16)
    srv.start()
    baseline = threading.active_count()
    address = ("127.0.0.1", srv.port)
    conns: list[socket.socket] = []
    try:
        for i in range(12):
            conns.append(socket.create_connection(address, timeout=2))
            if i % 2:  # headers that never end
                conns[-1].sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        opened = time.monotonic()
        assert _get(srv.url + "/metrics")[0] == 200  # answered while the others hang
        assert not _closed_by_server(conns[0], 0.2)  # not dropped before its time
        # a byte every 0.1 s never lets a read time out, but the request as a whole does
        drip = socket.create_connection(address, timeout=2)
        started, dropped_after = time.monotonic(), None
        for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 40:
            try:
                drip.sendall(bytes([byte]))
            except OSError:
                dropped_after = time.monotonic() - started
                break
            if _closed_by_server(drip, 0.1):
                dropped_after = time.monotonic() - started
                break
        assert dropped_after is not None and 0.5 < dropped_after < 1.5, dropped_after
        assert all(_closed_by_server(c, max(0.05, opened + 1.5 - time.monotonic())) for c in conns)
        for c in conns:
            c.close()
        # at the limit: one more connection is closed unanswered, and the scrape answers once they time out
        conns = [socket.create_connection(address, timeout=2) for _ in range(16)]
        time.sleep(0.1)
        extra = socket.create_connection(address, timeout=2)
        conns.append(extra)
        assert _closed_by_server(extra, 0.3)
        assert all(_closed_by_server(c, 1.5) for c in conns[:16])
        assert _get(srv.url + "/metrics")[0] == 200
        deadline = time.monotonic() + 2
        while threading.active_count() > baseline and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() <= baseline
    finally:
        for c in conns:
            c.close()
        srv.stop()


def test_stop_ends_kept_alive_connections() -> None:
    """After stop(), a scraper's kept-alive connection is not answered any more."""
    state = FakeState()
    srv = ExporterServer(CollectorRegistry(auto_describe=False), state, "127.0.0.1", 0)
    srv.start()
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=2)
    try:
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b"ok\n"
        srv.stop()
        with pytest.raises((http.client.HTTPException, OSError)):
            conn.request("GET", "/healthz")
            conn.getresponse().read()
    finally:
        conn.close()
        srv.stop()


def test_metrics_are_gzipped_for_a_client_that_accepts_it() -> None:
    """Prometheus asks for gzip (Accept-Encoding: gzip): the page comes compressed, the same text once
    unpacked; a client that does not ask, or refuses it (q=0), gets it plain."""
    import gzip

    srv, _ = _served_server()
    try:
        def fetch(encoding: str | None) -> tuple[str | None, bytes]:
            headers = {"Accept-Encoding": encoding} if encoding is not None else {}
            req = urllib.request.Request(srv.url + "/metrics", headers=headers)
            with urllib.request.urlopen(req, timeout=2) as r:
                return r.headers.get("Content-Encoding"), r.read()

        plain_encoding, plain = fetch(None)
        assert plain_encoding is None and b"dprobe_predicted_gpu_memory_bytes{" in plain
        encoding, packed = fetch("gzip")
        assert encoding == "gzip" and len(packed) < len(plain) and gzip.decompress(packed) == plain
        assert fetch("gzip;q=0")[0] is None and fetch("identity")[0] is None
        assert fetch("br, gzip;q=0.5")[0] == "gzip"
    finally:
        srv.stop()


def _served_server(**kw) -> tuple[ExporterServer, FakeState]:
    state = FakeState()
    state.is_ready = (True, "ok")
    reg = CollectorRegistry(auto_describe=False)
    collector = SidecarCollector(state, clock=lambda: NOW)
    reg.register(collector)
    srv = ExporterServer(reg, state, "127.0.0.1", 0, fast=kw.pop("fast", lambda _reg: collector.render_text()), **kw)
    srv.start()
    return srv, state


def _answers(conn: socket.socket, path: str = "/healthz", within: float = 2.0) -> bool:
    """Whether a request for ``path`` on the open connection ``conn`` is answered 200."""
    conn.settimeout(within)
    try:
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        reply = http.client.HTTPResponse(conn)
        reply.begin()
        reply.read()
        return reply.status == 200
    except (OSError, http.client.HTTPException):
        return False


@pytest.mark.slow
def test_request_head_has_its_own_deadline_and_keep_alive_the_request_timeout() -> None:
    """The request line and headers must arrive within header_timeout of connecting (a trickle is cut off then,
    not after request_timeout), while a kept-alive connection may wait request_timeout for its next request,
    and requests sent together are answered in turn."""
    srv, _ = _served_server(header_timeout=0.3, request_timeout=3.0)
    address = ("127.0.0.1", srv.port)
    try:
        drip = socket.create_connection(address, timeout=2)
        started, dropped_after = time.monotonic(), None
        for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 100:
            try:
                drip.sendall(bytes([byte]))
            except OSError:
                dropped_after = time.monotonic() - started
                break
            if _closed_by_server(drip, 0.05):
                dropped_after = time.monotonic() - started
                break
        assert dropped_after is not None and 0.25 < dropped_after < 1.2, dropped_after
        drip.close()
        kept = socket.create_connection(address, timeout=2)
        assert _answers(kept)
        time.sleep(0.8)  # idle well past header_timeout: still open for the next request
        assert _answers(kept, "/metrics")
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        answers = b""
        while not answers.endswith(b"ready: ok\n"):
            data = kept.recv(4096)
            assert data, answers
            answers += data
        parts = answers.split(b"HTTP/1.1 ")[1:]
        assert [p.split(b" ", 1)[0] for p in parts] == [b"200", b"200"], answers
        assert parts[0].endswith(b"\r\n\r\nok\n") and parts[1].endswith(b"\r\n\r\nready: ok\n"), answers
        kept.close()
    finally:
        srv.stop()


def test_at_the_cap_idle_kept_alive_connections_make_room() -> None:
    """Clients that keep their connections open after a request never lock out a new one: the longest idle
    is closed for it, and the newest stay usable."""
    srv, _ = _served_server(max_connections=4)
    address = ("127.0.0.1", srv.port)
    clients: list[socket.socket] = []
    try:
        for i in range(7):
            clients.append(socket.create_connection(address, timeout=2))
            assert _answers(clients[-1]), f"client {i} not answered"
        assert sum(not _closed_by_server(c, 0.05) for c in clients) <= 4
        assert all(_closed_by_server(c, 0.05) for c in clients[:3])  # the oldest went first
        assert _answers(clients[-1]) and _answers(clients[-2])
    finally:
        for c in clients:
            c.close()
        srv.stop()


@pytest.mark.slow
def test_reserve_lets_a_scrape_through_while_slow_clients_hold_every_slot() -> None:
    """Slow clients on every slot: a scrape still gets a reserve slot, and once its request is in, the
    connection that has spent longest on its request is closed for it; the other slow ones wait for their own
    deadline. Only when every connection is being answered is a new one closed unanswered."""
    release = threading.Event()

    def render(_reg: CollectorRegistry) -> bytes:
        release.wait(5)
        return b"# an answer that waits\n"

    srv, _ = _served_server(max_connections=8, fast=render)
    address = ("127.0.0.1", srv.port)
    slow: list[socket.socket] = []
    try:
        release.set()
        for _ in range(8):
            slow.append(socket.create_connection(address, timeout=2))
            slow[-1].sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: a")
        time.sleep(0.1)
        started = time.monotonic()
        assert _get(srv.url + "/metrics")[0] == 200
        assert time.monotonic() - started < 1.0
        closed = [_closed_by_server(c, 0.1) for c in slow]
        assert closed == [True] + [False] * 6 + [True], closed  # the oldest in its slot, the one in the reserve
        for c in slow:
            c.close()
        # every connection being answered: a new one is closed unanswered, and the others still answered
        time.sleep(0.2)
        release.clear()
        waiting = [socket.create_connection(address, timeout=5) for _ in range(8)]
        for c in waiting:
            c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.3)
        extra = socket.create_connection(address, timeout=2)
        assert _closed_by_server(extra, 1.0)
        extra.close()
        release.set()
        for c in waiting:
            reply = http.client.HTTPResponse(c)
            reply.begin()
            assert reply.status == 200 and reply.read() == b"# an answer that waits\n"
            c.close()
    finally:
        release.set()
        for c in slow:
            c.close()
        srv.stop()


# A slowloris client: COUNT connections on 127.0.0.1:PORT, each sending a request's first bytes a byte every GAP s
# and never ending them, each reconnecting at once when the server closes it, for SECONDS s; prints "ready"
# once connected, then how many connections it opened in all. Over "http" each trickles a request's headers; over
# "https" every other connection trickles the start of a TLS ClientHello (a record announcing 512 bytes) and
# the others send nothing at all.
SLOWLORIS = r"""
import selectors, socket, sys, time
port, count, seconds, gap, kind = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
heads = {"http": [b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 1_000_000],
         "https": [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 1_000_000, b""]}[kind]
sel, conns, opened = selectors.DefaultSelector(), {}, 0
def connect():
    global opened
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    conns[s] = [time.monotonic(), 0, heads[opened % len(heads)]]
    sel.register(s, selectors.EVENT_READ)
    opened += 1
def again(s):
    sel.unregister(s)
    del conns[s]
    s.close()
    connect()
for _ in range(count):
    connect()
print("ready", flush=True)
end = time.monotonic() + seconds
while (now := time.monotonic()) < end:
    for key, _ in sel.select(0.01):
        try:
            data = key.fileobj.recv(4096)
        except BlockingIOError:
            continue
        except OSError:
            data = b""
        if not data:
            again(key.fileobj)
    for s, st in list(conns.items()):
        if now >= st[0] and st[1] < len(st[2]):
            try:
                s.send(st[2][st[1]:st[1] + 1])
                st[1] += 1
            except BlockingIOError:
                pass
            except OSError:
                again(s)
                continue
            st[0] = now + gap
print(opened, flush=True)
"""


@pytest.mark.slow  # 200 slow connections for about 8 s
@pytest.mark.parametrize("kind", ["http", "https"])
def test_scrapes_succeed_under_200_slow_connections(kind: str, request: pytest.FixtureRequest) -> None:
    """A slowloris client holding 200 connections on 127.0.0.1 (reconnecting as soon as it is closed) while four
    scrapers scrape /metrics on new connections: at least 95 % of the scrapes are answered, and the server's
    threads stay bounded. Over HTTP the slow clients send a header byte every 0.25 s; over HTTPS half of them
    send the start of a ClientHello as slowly and half send nothing at all, and each scrape needs a whole TLS
    handshake."""
    tls = kind == "https"
    cert, key = request.getfixturevalue("certificate") if tls else (Path(), Path())
    srv, _ = _served_server(**({"tls_cert_file": str(cert), "tls_key_file": str(key)} if tls else {}))
    baseline = threading.active_count()
    scrape_for = 5.0
    attack = subprocess.Popen([sys.executable, "-c", SLOWLORIS, str(srv.port), "200", str(scrape_for + 4), "0.25",
                               kind], stdout=subprocess.PIPE, text=True)
    tally = {"ok": 0, "tried": 0, "threads": 0}
    lock = threading.Lock()
    try:
        assert attack.stdout is not None and attack.stdout.readline().strip() == "ready"
        time.sleep(1.5)  # the slow connections take every slot
        stop_at = time.monotonic() + scrape_for

        def scrape() -> None:
            while time.monotonic() < stop_at:
                ok = False
                conn = (http.client.HTTPSConnection("127.0.0.1", srv.port, timeout=5, context=_trusting(cert)) if tls
                        else http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5))
                try:
                    conn.request("GET", "/metrics", headers={"Accept": "text/plain;version=0.0.4"})
                    reply = conn.getresponse()
                    ok = reply.status == 200 and b"dprobe_observed_gpu_memory_bytes{" in reply.read()
                except (OSError, http.client.HTTPException):
                    pass
                finally:
                    conn.close()
                with lock:
                    tally["tried"] += 1
                    tally["ok"] += ok
                    tally["threads"] = max(tally["threads"], threading.active_count() - baseline)
                time.sleep(0.05)

        scrapers = [threading.Thread(target=scrape) for _ in range(4)]
        for t in scrapers:
            t.start()
        for t in scrapers:
            t.join()
        opened = int(attack.communicate(timeout=30)[0].strip())
    finally:
        if attack.poll() is None:
            attack.kill()
            attack.wait()
        srv.stop()
    assert tally["tried"] >= 20, tally
    assert tally["ok"] >= 0.95 * tally["tried"], tally
    assert opened > 400, opened  # the slow connections were closed (and came back) again and again
    assert tally["threads"] <= 4 + 64, tally  # a thread per request being answered, none per slow client


def _samples(text: str) -> list:
    return sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                  for fam in text_string_to_metric_families(text) for s in fam.samples)


def test_fast_text_equals_client_python_rendering() -> None:
    state = FakeState(n=20)
    state.latest["ns/pod-3"] = Latest(NOW - 99.0, 1.0, 0.5, "fake")
    state.latest['we"ird\\pod'] = Latest(NOW - 2.0, 7.0, None, "fake", {"pod": 'we"ird\\pod', "UUID": "GPU-\n"})
    state.latest["gpu-only"] = Latest(NOW - 2.0, 8.0, 0.1, "fake")  # a source without identity labels
    state.latest["ns/pod-4"] = replace(state.latest["ns/pod-4"], extra={"power_watts": 300.0, "sm_clock_hertz": 1e9})
    state.jobs = [JOB]
    collector = SidecarCollector(state, clock=lambda: NOW)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    assert _samples(collector.render_text().decode()) == _samples(generate_latest(reg).decode())


def test_a_scrape_of_1000_targets_renders_from_what_the_forecast_loop_prepared() -> None:
    """The scrape renders the page the forecast loop prepared: every target, without a forecast at scrape
    time (how fast: benchmarks/sidecar.py, a scrape of 1,000 targets against its 50 ms target)."""
    state = FakeState(n=1000)
    collector = SidecarCollector(state, clock=lambda: NOW)
    collector.prepare(state.snap)  # done by the forecast loop when it publishes
    text = collector.render_text().decode()
    targets = {line.split('target="')[1].split('"')[0] for line in text.splitlines()
               if line.startswith("dprobe_observed_gpu_memory_bytes{")}
    assert len(targets) == 1000


# ---- HTTPS (tls_cert_file, tls_key_file)


@pytest.fixture(scope="module")
def certificate(make_certificate) -> tuple[Path, Path]:
    return make_certificate("server")


def _trusting(cert: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert))


def _tls_get(srv: ExporterServer, cert: Path, path: str, headers: dict[str, str] | None = None,
             timeout: float = 3.0) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(srv.url + path, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout, context=_trusting(cert)) as r:
        return r.status, dict(r.headers), r.read()


def test_https_serves_the_registry_gzipped_when_asked(certificate) -> None:
    """With a certificate and key, /metrics, /healthz and /readyz are served over TLS to a client that trusts
    the certificate, the same page as client_python renders, gzip-compressed when asked; a kept-alive
    connection, two requests in one write and a request head spread over several TLS records are answered."""
    cert, key = certificate
    srv, state = _served_server(tls_cert_file=str(cert), tls_key_file=str(key))
    try:
        assert srv.tls and srv.url == f"https://127.0.0.1:{srv.port}"
        code, headers, body = _tls_get(srv, cert, "/metrics")
        assert code == 200 and headers["Content-Type"].startswith("text/plain") and "Content-Encoding" not in headers
        assert _samples(body.decode()) == _samples(generate_latest(srv.httpd.registry).decode())
        code, headers, packed = _tls_get(srv, cert, "/metrics", {"Accept-Encoding": "gzip"})
        assert headers["Content-Encoding"] == "gzip" and len(packed) < len(body)
        assert gzip.decompress(packed) == body
        assert _tls_get(srv, cert, "/healthz")[::2] == (200, b"ok\n")
        assert _tls_get(srv, cert, "/readyz")[::2] == (200, b"ready: ok\n")
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # trusted by nobody else
            urllib.request.urlopen(srv.url + "/healthz", timeout=3)
        raw = socket.create_connection(("127.0.0.1", srv.port), timeout=3)
        with _trusting(cert).wrap_socket(raw, server_hostname="127.0.0.1") as kept:
            assert _answers(kept) and _answers(kept, "/metrics")
            big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n"  # 3 TLS records
            kept.sendall(big + b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            answers = b""
            while not answers.endswith(b"ready: ok\n"):
                data = kept.recv(4096)
                assert data, answers
                answers += data
            assert answers.count(b"HTTP/1.1 200 OK") == 2 and b"\r\n\r\nok\n" in answers, answers
    finally:
        srv.stop()


def _refused(conn: socket.socket, within: float) -> bool:
    """Whether the server ends ``conn`` (closes it, resets it) within ``within`` s without a reply."""
    conn.settimeout(within)
    try:
        return conn.recv(4096) == b""
    except (ConnectionResetError, ConnectionAbortedError):
        return True
    except TimeoutError:
        return False


def test_plain_http_to_the_https_port_is_refused_and_tls_still_served(certificate, caplog) -> None:
    """A plain HTTP request on the TLS port gets no page: the handshake fails, the connection is closed, and
    that is logged as a warning; TLS clients are answered before and after."""
    cert, key = certificate
    srv, _ = _served_server(tls_cert_file=str(cert), tls_key_file=str(key))
    try:
        assert _tls_get(srv, cert, "/healthz")[0] == 200
        with caplog.at_level(logging.WARNING, logger="dprobe.services.exporter.server"), \
                socket.create_connection(("127.0.0.1", srv.port), timeout=3) as plain:
            plain.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _refused(plain, 2.0)
        assert srv.httpd.tls_failures == 1
        assert any("TLS handshake failed" in r.getMessage() for r in caplog.records), caplog.records
        with pytest.raises((http.client.HTTPException, OSError)):  # what an HTTP client sees
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=3)
            try:
                conn.request("GET", "/metrics")
                conn.getresponse().read()
            finally:
                conn.close()
        code, _, body = _tls_get(srv, cert, "/metrics")
        assert code == 200 and b"dprobe_predicted_gpu_memory_bytes{" in body
    finally:
        srv.stop()


def test_a_handshake_never_finished_is_closed_after_header_timeout(certificate) -> None:
    """A client that connects and sends nothing, or half a ClientHello, holds its slot for header_timeout and
    is closed then; meanwhile TLS clients are answered at once, the handshake never waiting on the loop. At
    the cap, silent connections make room for a scrape like slow ones."""
    cert, key = certificate
    srv, _ = _served_server(tls_cert_file=str(cert), tls_key_file=str(key), header_timeout=0.6,
                            request_timeout=3.0)
    address = ("127.0.0.1", srv.port)
    silent: list[socket.socket] = []
    try:
        silent.append(socket.create_connection(address, timeout=3))
        silent.append(socket.create_connection(address, timeout=3))
        silent[-1].sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # the start of a ClientHello
        opened = time.monotonic()
        for _ in range(3):
            started = time.monotonic()
            assert _tls_get(srv, cert, "/healthz")[0] == 200
            assert time.monotonic() - started < 0.5
        assert not _refused(silent[0], 0.05)  # not before its time
        for conn in silent:
            assert _refused(conn, 2.0)
            assert 0.5 < time.monotonic() - opened < 1.6, time.monotonic() - opened
        assert srv.httpd.tls_failures == 0  # timed out, not failed
        for conn in silent:
            conn.close()
    finally:
        for conn in silent:
            conn.close()
        srv.stop()
    srv, _ = _served_server(tls_cert_file=str(cert), tls_key_file=str(key), max_connections=4)
    silent = []
    try:
        silent = [socket.create_connection(("127.0.0.1", srv.port), timeout=3) for _ in range(4)]
        time.sleep(0.1)
        started = time.monotonic()
        assert _tls_get(srv, cert, "/metrics")[0] == 200
        assert time.monotonic() - started < 1.0
    finally:
        for conn in silent:
            conn.close()
        srv.stop()


def _pump(raw: socket.socket, tls: ssl.SSLObject, outgoing: ssl.MemoryBIO, incoming: ssl.MemoryBIO,
          step: Callable[[], Any]) -> Any:
    """``step()`` on a client's TLS object over ``raw``, sending what it writes and feeding it what comes back
    until it needs nothing more."""
    while True:
        try:
            done = step()
        except ssl.SSLWantReadError:
            raw.sendall(outgoing.read())
            data = raw.recv(65536)
            if not data:
                raise ConnectionResetError("closed by the server") from None
            incoming.write(data)
            continue
        raw.sendall(outgoing.read())
        return done


def test_a_handshake_under_way_is_never_closed_for_a_newer_connection(certificate) -> None:
    """Every slot taken by silent connections: a client that sent its ClientHello whole takes the reserve slot,
    and while it finishes its handshake newer connections (silent ones, as many as come) are closed instead of
    it; it is then answered."""
    cert, key = certificate
    srv, _ = _served_server(tls_cert_file=str(cert), tls_key_file=str(key), max_connections=4)
    address = ("127.0.0.1", srv.port)
    silent: list[socket.socket] = []
    try:
        assert (srv.httpd.max_connections, srv.httpd.reserve) == (4, 1)
        silent = [socket.create_connection(address, timeout=3) for _ in range(3)]  # the ordinary slots
        time.sleep(0.1)
        raw = socket.create_connection(address, timeout=3)
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        client = _trusting(cert).wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
        with pytest.raises(ssl.SSLWantReadError):
            client.do_handshake()
        raw.sendall(outgoing.read())  # the ClientHello, whole; the server's answer is not read yet
        time.sleep(0.1)
        newer = [socket.create_connection(address, timeout=3) for _ in range(5)]
        silent += newer
        assert all(_refused(c, 0.5) for c in newer)  # closed for want of a slot, not the handshake under way
        _pump(raw, client, outgoing, incoming, client.do_handshake)
        _pump(raw, client, outgoing, incoming, lambda: client.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
        reply = b""
        while not reply.endswith(b"\r\n\r\nok\n"):
            reply += _pump(raw, client, outgoing, incoming, lambda: client.read(65536))
        assert reply.startswith(b"HTTP/1.1 200 OK"), reply
        raw.close()
    finally:
        for conn in silent:
            conn.close()
        srv.stop()


def test_tls_settings_that_cannot_be_used_are_refused_at_construction(certificate, make_certificate, tmp_path) -> None:
    """Only one of the certificate and key, a missing file, a file that is no certificate, or a key of
    another certificate: a ValueError naming the file, before anything listens."""
    cert, key = certificate
    reg, state = CollectorRegistry(auto_describe=False), FakeState()

    def server(cert_file: object, key_file: object) -> ExporterServer:
        return ExporterServer(reg, state, "127.0.0.1", 0, tls_cert_file=cert_file, tls_key_file=key_file)

    with pytest.raises(ValueError, match="both tls_cert_file and tls_key_file, not tls_cert_file alone"):
        server(str(cert), None)
    with pytest.raises(ValueError, match="not tls_key_file alone"):
        server("", str(key))
    missing = tmp_path / "nope.crt"
    with pytest.raises(ValueError, match=f"cannot read the TLS certificate file {missing}"):
        server(str(missing), str(key))
    with pytest.raises(ValueError, match=f"cannot read the TLS key file {missing}"):
        server(str(cert), str(missing))
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ValueError, match=f"{garbage} holds no PEM certificate"):
        server(str(garbage), str(key))
    _, other_key = make_certificate("other")
    with pytest.raises(ValueError, match=f"the key in {other_key} is not the certificate's"):
        server(str(cert), str(other_key))
    srv = server(None, None)  # neither: plain HTTP
    try:
        assert not srv.tls and srv.url.startswith("http://")
    finally:
        srv.stop()


def test_a_renewed_certificate_is_served_without_a_restart(certificate, make_certificate, tmp_path, caplog) -> None:
    """The certificate and key files rewritten in place (a renewal) serve the next connections once
    tls_reload_check has passed; a renewal that cannot be loaded (a key of another certificate) is logged
    and the last good certificate kept, until the files are whole again."""
    first, first_key = certificate
    second, second_key = make_certificate("renewed")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(first, cert)
    shutil.copy(first_key, key)
    srv, _ = _served_server(tls_cert_file=str(cert), tls_key_file=str(key), tls_reload_check=0.2)
    try:
        assert _tls_get(srv, first, "/healthz")[0] == 200
        shutil.copy(second, cert)
        shutil.copy(second_key, key)
        time.sleep(0.3)
        with pytest.raises(urllib.error.URLError):  # the connection that looks at the files: already the new one
            _tls_get(srv, first, "/healthz")
        assert _tls_get(srv, second, "/healthz")[0] == 200 and srv.httpd.tls.reloads == 1
        shutil.copy(first, cert)  # half a renewal: the certificate without its key
        time.sleep(0.3)
        with caplog.at_level(logging.WARNING, logger="dprobe.services.exporter.server"):
            assert _tls_get(srv, second, "/healthz")[0] == 200  # the last good pair still served
        assert any("cannot be used, still serving the previous certificate" in r.getMessage()
                   for r in caplog.records), caplog.records
        shutil.copy(first_key, key)
        time.sleep(0.3)
        assert _tls_get(srv, first, "/healthz")[0] == 200 and srv.httpd.tls.reloads == 2  # whole again
    finally:
        srv.stop()
