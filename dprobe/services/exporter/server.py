"""The services' HTTP server: /metrics (Prometheus), /healthz (alive), /readyz (ready to answer)."""

from __future__ import annotations

import contextlib
import io
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Protocol

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Probe(Protocol):
    """What /readyz asks: ready or not, and why."""

    def ready(self) -> tuple[bool, str]: ...


REQUEST_TIMEOUT = 10.0  # s a client has to send a whole request, and to take the answer
MAX_CONNECTIONS = 64  # connections served at once (a thread each); more are closed at once


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() does not wait for connections still open: they time out on their own
    allow_reuse_address = True
    request_queue_size = MAX_CONNECTIONS  # listen backlog: a burst of connects is not dropped
    registry: CollectorRegistry
    state: Probe
    fast: Callable[[CollectorRegistry], bytes] | None
    request_timeout: float = REQUEST_TIMEOUT
    slots: threading.BoundedSemaphore
    _refused_logged: float = float("-inf")

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self.open_connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, handler)

    def close_connections(self) -> None:
        """End the connections still open (a scraper's kept-alive one would otherwise still be answered)."""
        with self.connections_lock:
            for conn in self.open_connections:
                with contextlib.suppress(OSError):  # closed meanwhile
                    conn.shutdown(socket.SHUT_RDWR)

    def process_request(self, request: socket.socket, client_address: object) -> None:
        """A thread per connection while fewer than ``MAX_CONNECTIONS`` are open; past that, close the new one
        (so half-open connections cannot pile up threads)."""
        if not self.slots.acquire(blocking=False):
            now = time.monotonic()
            if now - self._refused_logged > 60:
                log.warning("%s: too many connections open at once: refusing new ones until some close",
                            client_address)
                self._refused_logged = now
            self.shutdown_request(request)
            return
        with self.connections_lock:
            self.open_connections.add(request)
        try:
            super().process_request(request, client_address)
        except Exception:
            self._closed(request)
            raise

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._closed(request)

    def _closed(self, request: socket.socket) -> None:
        with self.connections_lock:
            self.open_connections.discard(request)
        self.slots.release()

    def handle_error(self, request: object, client_address: object) -> None:
        """A scraper that hangs up mid-request is routine: log it at debug level, not as a traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError, TimeoutError)):
            log.debug("client %s went away: %s", client_address, exc)
            return
        super().handle_error(request, client_address)


class _DeadlineReader(io.RawIOBase):
    """The connection's reads, each given what is left of the request's deadline as its socket timeout:
    a client that sends a request a byte at a time still has ``request_timeout`` s in all, not per byte."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.deadline = time.monotonic() + 3600.0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request not received in time")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # reads go through the deadline instead
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        """One request, read within ``request_timeout`` s of when the connection was ready for it (for a
        kept-alive connection, the wait for the next request counts too); a late one closes the connection."""
        self._reader.deadline = time.monotonic() + self.server.request_timeout
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()  # the request line and headers are read: the answer has as long again
        self.connection.settimeout(self.server.request_timeout)
        return ok

    def _send(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            accept = self.headers.get("Accept", "")
            fast = self.server.fast
            if fast is not None and ("text/plain" in accept or "openmetrics" not in accept):
                encoder, content_type = fast, TEXT_CONTENT_TYPE
            else:
                encoder, content_type = choose_encoder(accept)
            try:
                body = encoder(self.server.registry)
            except Exception as exc:  # never take the server down on a rendering bug
                log.exception("rendering /metrics failed")
                self._send(500, f"error: {exc}\n".encode())
                return
            self._send(200, body, content_type)
        elif path == "/healthz":
            self._send(200, b"ok\n")
        elif path == "/readyz":
            ok, why = self.server.state.ready()
            self._send(200 if ok else 503, f"{'ready' if ok else 'not ready'}: {why}\n".encode())
        elif path == "/":
            self._send(200, b"dprobe: /metrics /healthz /readyz\n")
        else:
            self._send(404, b"not found\n")

    do_HEAD = do_GET

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server API)
        log.debug("%s %s", self.address_string(), format % args)


class ExporterServer:
    """Serves the registry and the state's probes on ``address:port`` from a background thread.

    ``fast``, when given, renders text format 0.0.4 for every scraper that accepts it
    (Prometheus does); other Accept headers get client_python's encoders. A client has
    ``request_timeout`` s to send each request (and as long to take the answer), then its connection
    is closed; at most ``max_connections`` are served at once, and further ones are closed unanswered.
    """

    def __init__(self, registry: CollectorRegistry, state: Probe, address: str = "0.0.0.0",
                 port: int = 9477, fast: Callable[[CollectorRegistry], bytes] | None = None,
                 request_timeout: float = REQUEST_TIMEOUT, max_connections: int = MAX_CONNECTIONS):
        try:
            self.httpd = _Server((address, port), _Handler)
        except OSError as exc:  # port taken, address not local: say which, without a traceback
            raise OSError(exc.errno, f"cannot listen on {address}:{port}: {exc.strerror or exc}") from exc
        self.httpd.registry, self.httpd.state, self.httpd.fast = registry, state, fast
        self.httpd.request_timeout = request_timeout
        self.httpd.slots = threading.BoundedSemaphore(max_connections)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self.httpd.server_address[0]
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="exporter-http", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.httpd.close_connections()
        if self._thread is not None:
            self._thread.join(timeout)


def run_until_signalled(stop_event: threading.Event, start: Callable[[], None], stop: Callable[[], None]) -> int:
    """A service's main: ``start()``, wait for SIGTERM / SIGINT (which set ``stop_event``), ``stop()``; 0."""

    def _stop(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop_event.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    start()
    while not stop_event.wait(1.0):
        pass
    stop()
    log.info("stopped")
    return 0
