"""The HTTP client of the sources and the scaler (dprobe.services.sources.http) against a local HTTP/1.1 server
that counts the connections it accepts: kept-alive connections reused from one request to the next, the
deadline on the whole request held on a reused connection, a kept-alive connection the server closed meanwhile,
the body cap, redirects, and the TLS pool made again when the CA file changes."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dprobe.services.sources import http as client
from dprobe.services.sources.base import SourceError
from dprobe.services.sources.http import HttpAuth, http_get

BODY = b'{"status": "success"}'


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 (keep-alive); ``server.reply(handler) -> (status, body, how)`` says what to answer: ``how`` is
    ``"now"``, ``"body"`` (the body a byte every ``server.gap`` s), ``"head"`` (the whole answer so), ``"drop"``
    (the connection closed, nothing answered) or ``"chunked"``."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        with self.server.lock:  # type: ignore[attr-defined]
            self.server.connections += 1  # type: ignore[attr-defined]
        self.served = 0

    def do_GET(self) -> None:  # noqa: N802
        self.served += 1
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        status, body, how = self.server.reply(self)  # type: ignore[attr-defined]
        if how == "drop":
            self.close_connection = True
            return
        if how == "chunked":
            head = f"HTTP/1.1 {status} X\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
            data = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 4096]), body[i:i + 4096])
                            for i in range(0, len(body), 4096)) + b"0\r\n\r\n"
        else:
            location = "Location: /moved-here\r\n" if 300 <= status < 400 else ""
            head = f"HTTP/1.1 {status} X\r\n{location}Content-Length: {len(body)}\r\n\r\n".encode()
            data = body
        now, drip = {"now": (head + data, b""), "chunked": (head + data, b""), "body": (head, data),
                     "head": (b"", head + data)}[how]
        try:
            self.wfile.write(now)
            self.wfile.flush()
            for i in range(len(drip)):
                time.sleep(self.server.gap)  # type: ignore[attr-defined]
                self.wfile.write(drip[i:i + 1])
                self.wfile.flush()
        except OSError:  # the client gave up
            self.close_connection = True
        if drip:
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def counting_server(reply: Callable[[_Handler], tuple[int, bytes, str]], gap: float = 0.05,
                    tls: tuple[Path, Path] | None = None) -> Iterator[ThreadingHTTPServer]:
    """A keep-alive HTTP server on loopback answering with ``reply``; ``.connections``: how many it accepted,
    ``.url``: its base URL (https with ``tls``, a certificate and its key)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.lock, srv.connections, srv.paths = threading.Lock(), 0, []  # type: ignore[attr-defined]
    srv.reply, srv.gap = reply, gap  # type: ignore[attr-defined]
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        srv.socket = context.wrap_socket(srv.socket, server_side=True)
        scheme = "https"
    srv.url = f"{scheme}://127.0.0.1:{srv.server_address[1]}"  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def _ok(handler: _Handler) -> tuple[int, bytes, str]:
    return 200, BODY, "now"


def test_connections_are_kept_alive_and_reused_across_requests() -> None:
    """Requests to one server go on one connection, with or without credentials, error answers included (their
    body read, so the connection stays usable); a second client (another HttpAuth) has connections of its own."""
    answers = iter([(200, BODY, "now")] * 5 + [(500, b"oops", "now"), (404, b"", "now")] + [(200, BODY, "now")] * 5)
    with counting_server(lambda h: next(answers)) as srv:
        for _ in range(5):
            assert http_get(srv.url + "/api", 2.0) == BODY.decode()
        for status in (500, 404):
            with pytest.raises(SourceError, match=f"HTTP {status} X"):
                http_get(srv.url + "/api", 2.0)
        auth = HttpAuth(headers={"X-Scope-OrgID": "team-a"})
        for _ in range(5):
            assert http_get(srv.url + "/api", 2.0, auth=auth) == BODY.decode()
        assert srv.connections == 2  # one for the requests without credentials, one for auth's


@pytest.mark.parametrize("how", ["body", "head"])
def test_the_deadline_holds_on_a_reused_connection_that_trickles(how: str) -> None:
    """A server that answers a byte every 0.05 s on a connection kept from the request before: cut off once the
    timeout has passed since the request began (each byte well within it); the next request opens a new
    connection and is read."""
    state = {"how": "now"}
    with counting_server(lambda h: (200, BODY * 20, state["how"]), gap=0.05) as srv:
        assert http_get(srv.url + "/api", 2.0)
        state["how"] = how
        started = time.monotonic()
        with pytest.raises(SourceError, match=r"timed out after 0\.3 s"):
            http_get(srv.url + "/api", 0.3)
        assert 0.25 < time.monotonic() - started < 0.8
        assert srv.connections == 1  # it was the kept-alive one
        state["how"] = "now"
        assert http_get(srv.url + "/api", 2.0) == (BODY * 20).decode()
        assert srv.connections == 2


def test_a_kept_alive_connection_the_server_closed_is_tried_once_more_on_a_new_one() -> None:
    """The server closes its kept-alive connection as the next request comes (an idle timeout racing it), without
    an answer: the request goes again on a new connection, once; a fresh connection dropped is an error."""
    with counting_server(lambda h: (200, BODY, "drop" if h.served == 2 else "now")) as srv:
        assert http_get(srv.url + "/a", 2.0) == BODY.decode()
        assert http_get(srv.url + "/b", 2.0) == BODY.decode()
        assert srv.paths == ["/a", "/b", "/b"] and srv.connections == 2
    with counting_server(lambda h: (200, BODY, "drop")) as srv:
        with pytest.raises(SourceError, match="closed connection without response"):
            http_get(srv.url + "/a", 2.0)
        assert srv.connections == 1


def test_the_body_cap_and_redirects(monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer over MAX_BODY_BYTES is refused, told by its Content-Length or counted as it comes (chunked), and
    its connection dropped; a client without credentials follows a redirect (one with credentials does not:
    test_prometheus_auth)."""
    monkeypatch.setattr(client, "MAX_BODY_BYTES", 1000)
    monkeypatch.setattr(client, "CHUNK_BYTES", 256)
    replies = {"/big": (200, b"x" * 1001, "now"), "/chunked": (200, b"x" * 5000, "chunked"),
               "/fits": (200, b"x" * 1000, "chunked"), "/old": (302, b"", "now"), "/moved-here": (200, BODY, "now")}
    with counting_server(lambda h: replies[h.path]) as srv:
        for path in ("/big", "/chunked"):
            with pytest.raises(SourceError, match="response larger than 1000 bytes"):
                http_get(srv.url + path, 2.0)
        assert http_get(srv.url + "/fits", 2.0) == "x" * 1000
        assert srv.connections == 3  # a new one after each refused answer
        assert http_get(srv.url + "/old", 2.0) == BODY.decode()
        assert srv.paths[-2:] == ["/old", "/moved-here"] and srv.connections == 3  # on the kept one


def test_errors_in_one_line() -> None:
    with pytest.raises(SourceError, match="credentials in a URL are not sent; give them as prometheus_username"):
        http_get("http://u:s3cret@127.0.0.1:1/", 1.0, auth=HttpAuth(prefix="prometheus_"))
    with pytest.raises(SourceError, match="Not supported URL scheme ftp"):
        http_get("ftp://127.0.0.1/", 1.0)
    with counting_server(_ok) as srv:
        port = srv.server_address[1]
    with pytest.raises(SourceError, match=r"127\.0\.0\.1:\d+/: \[Errno \d+\] Connection refused$"):
        http_get(f"http://127.0.0.1:{port}/", 1.0)


@pytest.mark.slow  # making the certificate (openssl, RSA 2048) takes seconds
def test_the_tls_pool_is_made_again_when_the_ca_file_changes(make_certificate, tmp_path: Path) -> None:
    """Over https the handshake is made once for many requests; a CA file swapped in (as a renewed Secret is)
    makes a new TLS context, and the requests after go on a new connection made with it."""
    cert, key = make_certificate("keepalive")
    ca = tmp_path / "ca.crt"
    ca.write_bytes(cert.read_bytes())
    auth = HttpAuth(ca_file=str(ca))
    with counting_server(_ok, tls=(cert, key)) as srv:
        for _ in range(5):
            assert http_get(srv.url + "/api", 2.0, auth=auth) == BODY.decode()
        assert srv.connections == 1
        tmp = ca.with_suffix(".new")
        tmp.write_bytes(cert.read_bytes())
        os.replace(tmp, ca)
        for _ in range(3):
            assert http_get(srv.url + "/api", 2.0, auth=auth) == BODY.decode()
        assert srv.connections == 2
        with pytest.raises(SourceError, match="certificate was not verified .*set ca_file"):
            http_get(srv.url + "/api", 2.0)  # the system's CAs do not know it
        with pytest.raises(SourceError, match="certificate was not verified .*(mismatch|match)"):
            http_get(srv.url.replace("127.0.0.1", "localhost") + "/api", 2.0, auth=auth)  # not its name
        insecure = HttpAuth(insecure_skip_verify=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning at each request: the option says what it does
            assert http_get(srv.url + "/api", 2.0, auth=insecure) == http_get(srv.url + "/api", 2.0, auth=insecure)


def test_the_proxy_of_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """http_proxy / no_proxy are followed as the standard library follows them: a request goes to the proxy (the
    URL in absolute form), on a connection kept alive, unless no_proxy names its host."""
    for name in ("no_proxy", "NO_PROXY", "HTTP_PROXY", "REQUEST_METHOD"):
        monkeypatch.delenv(name, raising=False)
    with counting_server(_ok) as closed:
        target = f"http://127.0.0.1:{closed.server_address[1]}/api"
    with counting_server(lambda h: (200, b"via the proxy", "now")) as proxy:
        monkeypatch.setenv("http_proxy", proxy.url)
        assert http_get(target, 2.0) == http_get(target, 2.0) == "via the proxy"
        assert proxy.paths == [target, target] and proxy.connections == 1
        monkeypatch.setenv("no_proxy", "127.0.0.1")
        with pytest.raises(SourceError, match="Connection refused"):
            http_get(target, 2.0)


@contextmanager
def slow_relay(upstream: tuple[str, int], gap: float) -> Iterator[int]:
    """A TCP relay on loopback passing ``upstream``'s bytes to the client one every ``gap`` s (the client's at
    once); yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    stop = threading.Event()

    def pipe(src: socket.socket, dst: socket.socket, drip: bool) -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set() and (data := src.recv(4096)):
                for i in range(len(data)) if drip else [None]:
                    if drip and stop.wait(gap):
                        return
                    dst.sendall(data[i:i + 1] if i is not None else data)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            up = socket.create_connection(upstream)
            for src, dst, drip in ((conn, up, False), (up, conn, True)):
                threading.Thread(target=pipe, args=(src, dst, drip), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()


@pytest.mark.slow  # making the certificate (openssl, RSA 2048) takes seconds
def test_the_deadline_holds_through_a_tls_handshake_that_trickles(make_certificate, tmp_path: Path) -> None:
    """A TLS server whose handshake comes a byte every 0.02 s (each byte well within the timeout, the whole
    handshake taking far longer): cut off once the timeout has passed since the request began."""
    cert, key = make_certificate("keepalive")
    auth = HttpAuth(ca_file=str(cert))
    with counting_server(_ok, tls=(cert, key)) as srv, slow_relay(("127.0.0.1", srv.server_address[1]), 0.02) as port:
        started = time.monotonic()
        with pytest.raises(SourceError, match=r"timed out after 0\.5 s"):
            http_get(f"https://127.0.0.1:{port}/api", 0.5, auth=auth)
        assert 0.45 < time.monotonic() - started < 1.2
