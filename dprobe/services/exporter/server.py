"""The services' HTTP server: /metrics (Prometheus), /healthz (alive), /readyz (ready to answer).

One thread waits on every connection at once (``selectors``) and reads each request's line and headers as
they trickle in; only a request that has arrived whole gets a thread to answer it. So a slow client holds a
connection slot for at most ``header_timeout`` s and never a thread, and when every slot is taken the slots
go to the clients that send their requests, not to the slowest ones:

- a client has ``header_timeout`` s (2) from when it connects, or starts its next request on a kept-alive
  connection, to send the request line and headers; then its connection is closed, unanswered;
- a kept-alive connection may wait ``request_timeout`` s (10) for its next request, and an answer has as long
  to be taken;
- at most ``max_connections`` (64) are open at once, ``reserve`` (an eighth) of them kept for new
  connections. A new connection finding the others taken gets a reserve slot, in which it must send its
  request within a quarter of ``header_timeout``; once its request has arrived it moves to an ordinary slot,
  closing, when none is free, the longest-idle kept-alive connection or else the connection that has spent
  longest sending its request (never one being answered). At the cap, a new connection closes the
  longest-idle kept-alive connection and takes its slot, or else the oldest reserve connection still
  without its request; only when every other connection is being answered is it closed unanswered.

With a certificate and key (``tls_cert_file``, ``tls_key_file``) it speaks HTTPS only (TLS 1.2 or later). The
handshake is off the accept path: a new connection is only looked at (its waiting bytes peeked, no
cryptography) and given its slot, and the loop then drives its handshake as its bytes arrive, never waiting
on one. The handshake counts against the connection's deadline like the request's head (``header_timeout``,
the reserve's quarter of it), and a failed one (a plain HTTP client, a peer that does not trust the
certificate) closes the connection, logged as a warning at most once a minute. A client whose first bytes,
when the connection is first read, are a whole TLS record (its ClientHello, which a TLS client sends at once)
is never closed to make room for a newer connection while its handshake and its request are under way: it is
answered, or runs out of time. So idle clients, and clients sending their ClientHello a few bytes at a time,
only ever take each other's slots, never a scrape's. The two files are looked at again, at a new connection,
every ``TLS_RELOAD_CHECK`` s: a renewed pair (cert-manager rewriting a Secret's files) serves the next
handshakes, and a pair that cannot be loaded (half written, mismatched) is logged and the previous one kept.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import logging
import os
import re
import selectors
import signal
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from types import FrameType
from typing import Protocol

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Probe(Protocol):
    """What /readyz asks: ready or not, and why."""

    def ready(self) -> tuple[bool, str]: ...


HEADER_TIMEOUT = 2.0  # s a client has to send a request's line and headers
TLS_RELOAD_CHECK = 10.0  # s between looks at the TLS certificate's and key's files
REQUEST_TIMEOUT = 10.0  # s a kept-alive connection may wait for its next request, and an answer to be taken
MAX_CONNECTIONS = 64  # connections open at once
MAX_HEAD_BYTES = 65536  # a request line and headers longer than this are answered 431
PROBATION = 0.25  # share of the header timeout a connection in a reserve slot has to send its request
HEAD_END = re.compile(rb"\r?\n\r?\n")
LOG_EVERY = 60.0  # s between two warnings of the same kind
GZIP_MIN_BYTES = 1024  # /metrics pages shorter than this go uncompressed whatever the client accepts
GZIP_LEVEL = 6
TLS_RECORD_MAX = 5 + 16384  # a TLS record's header and its longest plaintext body (a ClientHello fits in one)


@dataclass(eq=False)
class _Conn:
    """A client connection: reading a request's head (``head``), waiting for the next one (``idle``) or being
    answered by a worker thread (``busy``)."""

    sock: socket.socket
    address: tuple[str, int]
    reserved: bool  # holds one of the slots kept for new connections
    state: str = "head"
    since: float = 0.0  # when the wait for the current request began
    deadline: float = 0.0
    buffer: bytearray = field(default_factory=bytearray)
    handshake: bool = False  # a TLS handshake still under way
    peeked: bool = False  # TLS: its first bytes were looked at (and handed to the handshake)
    hello: bool = False  # TLS: its first bytes were a whole ClientHello; kept until its request is in
    events: int = selectors.EVENT_READ  # what the selector waits for on ``sock``


class _Handler(BaseHTTPRequestHandler):
    """Answers one request whose line and headers (``head``) were read by the server's loop."""

    server: _Server  # type: ignore[assignment]
    protocol_version = "HTTP/1.1"

    def __init__(self, sock: socket.socket, address: tuple[str, int], server: _Server, head: bytes) -> None:
        self.head = head
        # typeshed makes timeout a ClassVar; StreamRequestHandler.setup() reads it from the instance
        self.timeout = server.request_timeout  # type: ignore[misc]
        super().__init__(sock, address, server)  # type: ignore[arg-type]

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self.rfile = io.BytesIO(self.head)

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()

    def _send(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
              compress: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        if compress and len(body) >= GZIP_MIN_BYTES and _accepts_gzip(self.headers.get("Accept-Encoding", "")):
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
            self.send_header("Content-Encoding", "gzip")
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
            self._send(200, body, content_type, compress=True)
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


def _accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header takes gzip (Prometheus sends ``gzip``; ``gzip;q=0`` refuses it)."""
    for part in accept_encoding.split(","):
        name, _, params = part.strip().partition(";")
        if name.strip().lower() in ("gzip", "*"):
            q = params.strip().lower()
            return not (q.startswith("q=") and q[2:].strip() in ("0", "0.0", "0.00", "0.000"))
    return False


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context (TLS 1.2 or later) with the certificate chain in ``cert_file`` and its key in
    ``key_file`` (PEM); ValueError naming the file when one cannot be read or they do not match."""
    texts = {}
    for what, path in (("certificate", cert_file), ("key", key_file)):
        try:
            with open(path, "rb") as f:
                texts[what] = f.read()
        except OSError as exc:
            raise ValueError(f"cannot read the TLS {what} file {path}: {exc.strerror or exc}") from exc
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            why = f"the key in {key_file} is not the certificate's"
        elif b"-----BEGIN CERTIFICATE-----" not in texts["certificate"]:
            why = f"{cert_file} holds no PEM certificate"
        elif b"PRIVATE KEY-----" not in texts["key"]:
            why = f"{key_file} holds no PEM private key"
        else:
            why = str(exc)
        raise ValueError(f"cannot load the TLS certificate {cert_file} with the key {key_file}: {why}") from exc
    return context


class TLSFiles:
    """The server context of a certificate and key file (:func:`tls_context`), made again when either file
    changes: at most every ``check`` s, :meth:`context` compares the files' modification times, sizes and
    inodes (a Kubernetes Secret volume swaps a symlink) with those it was loaded from. A changed pair that
    cannot be loaded keeps the context in use, with a warning, until the files change again."""

    def __init__(self, cert_file: str, key_file: str, check: float = TLS_RELOAD_CHECK) -> None:
        self.cert_file, self.key_file, self.check = cert_file, key_file, check
        self._stamp = self._files()
        self._context = tls_context(cert_file, key_file)  # ValueError at start, naming the file
        self._refused: tuple | None = None
        self._next = time.monotonic() + check
        self.reloads = 0  # times a renewed pair was loaded

    def _files(self) -> tuple | None:
        try:
            return tuple((st.st_mtime_ns, st.st_size, st.st_ino)
                         for st in (os.stat(self.cert_file), os.stat(self.key_file)))
        except OSError:
            return None  # mid-rename: looked at again next time

    def context(self, now: float | None = None) -> ssl.SSLContext:
        """The context to wrap a new connection with (the files looked at when ``check`` s have passed)."""
        now = time.monotonic() if now is None else now
        if now < self._next:
            return self._context
        self._next = now + self.check
        stamp = self._files()
        if stamp is None or stamp == self._stamp or stamp == self._refused:
            return self._context
        try:
            self._context = tls_context(self.cert_file, self.key_file)
        except ValueError as exc:
            self._refused = stamp
            log.warning("the TLS files changed but cannot be used, still serving the previous certificate: %s", exc)
            return self._context
        self._stamp, self._refused = stamp, None
        self.reloads += 1
        log.info("TLS certificate %s reloaded", self.cert_file)
        return self._context


def _has_body(handler: _Handler) -> bool:
    """Whether the request announced a body (which is never read: the connection is closed after the answer)."""
    headers = getattr(handler, "headers", None)
    if headers is None:
        return False
    return headers.get("Content-Length", "0").strip() not in ("", "0") or "Transfer-Encoding" in headers


class _Server:
    """The listening socket, the connections, and the loop that reads requests and hands them to threads."""

    def __init__(self, address: str, port: int, registry: CollectorRegistry, state: Probe,
                 fast: Callable[[CollectorRegistry], bytes] | None, header_timeout: float, request_timeout: float,
                 max_connections: int, reserve: int, tls: TLSFiles | None = None) -> None:
        self.registry, self.state, self.fast, self.tls = registry, state, fast, tls
        self.request_timeout = request_timeout
        self.header_timeout = min(header_timeout, request_timeout)
        self.probation = PROBATION * self.header_timeout
        self.max_connections, self.reserve = max_connections, reserve
        self.accept_batch = max(1, reserve)  # a new connection is read before this many more can close it
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind((address, port))
            self.listener.listen(max(1024, max_connections))  # a burst of connects waits to be accepted
        except OSError:
            self.listener.close()
            raise
        self.listener.setblocking(False)
        self.server_address = self.listener.getsockname()
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, "listen")
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.conns: dict[socket.socket, _Conn] = {}
        self.returned: deque[tuple[_Conn, bool, bytes]] = deque()  # answered by a worker, back to the loop
        self.lock = threading.Lock()
        self.stopping = False
        self.closed = False
        self.accept_paused_until = 0.0
        self.logged: dict[str, float] = {}
        self.tls_failures = 0  # connections closed for a failed TLS handshake

    # ---- the loop (one thread)

    def serve(self) -> None:
        try:
            while not self.stopping:
                now = time.monotonic()
                deadlines = [c.deadline for c in self.conns.values() if c.state != "busy"]
                timeout = min([0.5, *(d - now for d in deadlines)])
                events = self.selector.select(max(0.0, timeout))
                accept = False
                for key, _mask in events:
                    if key.data == "listen":
                        accept = True
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            while self.wake_r.recv(4096):
                                pass
                    elif isinstance(key.data, _Conn) and key.data.sock in self.conns:
                        self._read(key.data)
                self._take_back()
                self._expire(time.monotonic())
                if accept:
                    self._accept()
                elif self.accept_paused_until and time.monotonic() >= self.accept_paused_until:
                    self.accept_paused_until = 0.0
                    self.selector.register(self.listener, selectors.EVENT_READ, "listen")
        except Exception:
            log.exception("the HTTP server's loop failed")
            raise
        finally:
            self._close_all()

    def _accept(self) -> None:
        for _ in range(self.accept_batch):
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors: stop accepting for a moment rather than spin
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._warn("accept", "cannot accept connections: %s", exc)
                    self.selector.unregister(self.listener)
                    self.accept_paused_until = time.monotonic() + 0.1
                return
            reserved = self._admit()
            if reserved is None:
                self._warn("refused", "%s: every connection is being answered (or finishing its TLS handshake): "
                           "refusing new ones until one ends", address[0])
                sock.close()
                continue
            now = time.monotonic()
            sock.setblocking(False)
            if self.tls is not None:
                try:
                    sock = self.tls.context(now).wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except OSError as exc:
                    log.debug("%s: cannot start TLS: %s", address[0], exc)
                    sock.close()
                    continue
            conn = _Conn(sock, address, reserved, handshake=self.tls is not None)
            self._wait_for_head(conn, now)
            self.conns[sock] = conn
            self.selector.register(sock, selectors.EVENT_READ, conn)
            if conn.handshake:  # only looked at: the loop runs its handshake when it next reads
                self._peek_hello(conn)
            else:
                self._read(conn)  # a request sent with the connection is taken at once

    def _admit(self) -> bool | None:
        """A slot for a new connection: an ordinary one (False), a reserve one (True), or none."""
        ordinary = sum(not c.reserved for c in self.conns.values())
        if ordinary < self.max_connections - self.reserve:
            return False
        if len(self.conns) - ordinary < self.reserve:
            return True
        idle = self._oldest(lambda c: c.state == "idle")  # at the cap: the longest idle first
        if idle is not None:
            self._close(idle)
            return idle.reserved
        waiting = self._oldest(lambda c: c.reserved and c.state == "head" and not c.hello)
        if waiting is None:
            return None
        self._warn("evicted", "%s: too many connections: closing those slowest to send their requests",
                   waiting.address[0])
        self._close(waiting)
        return True

    def _promote(self, conn: _Conn) -> None:
        """Move ``conn`` (reserved, its request arrived) to an ordinary slot, making room if it must."""
        ordinary = sum(not c.reserved for c in self.conns.values())
        if ordinary >= self.max_connections - self.reserve:
            victim = (self._oldest(lambda c: not c.reserved and c.state == "idle")
                      or self._oldest(lambda c: not c.reserved and c.state == "head" and not c.hello))
            if victim is None:
                return  # every ordinary slot is answering: answered from the reserve
            self._warn("evicted", "%s: too many connections: closing those slowest to send their requests",
                       victim.address[0])
            self._close(victim)
        conn.reserved = False

    def _oldest(self, which: Callable[[_Conn], bool]) -> _Conn | None:
        found = [c for c in self.conns.values() if which(c)]
        return min(found, key=lambda c: c.since) if found else None

    def _wait_for_head(self, conn: _Conn, now: float) -> None:
        conn.state, conn.since = "head", now
        conn.deadline = now + (min(self.header_timeout, self.probation) if conn.reserved else self.header_timeout)

    def _wait_for(self, conn: _Conn, events: int) -> None:
        """Have the selector wait for ``events`` on ``conn`` (TLS may need to write before it can read)."""
        if conn.events != events:
            conn.events = events
            self.selector.modify(conn.sock, events, conn)

    def _peek_hello(self, conn: _Conn) -> bool:
        """Look at the bytes waiting on ``conn`` before its handshake reads any: ``conn.hello`` when they are a
        whole TLS handshake record (the ClientHello). False while nothing has come (nothing to hand over)."""
        try:
            data = socket.socket.recv(conn.sock, TLS_RECORD_MAX, socket.MSG_PEEK)  # the socket's, not TLS's
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""  # reset: the handshake finds out and closes it
        conn.peeked = True
        conn.hello = len(data) >= 5 and data[0] == 0x16 and len(data) >= 5 + int.from_bytes(data[3:5], "big")
        return True

    def _handshake(self, conn: _Conn) -> bool:
        """Take ``conn``'s TLS handshake as far as its bytes allow: whether it is done (``conn`` is closed when
        it failed)."""
        assert isinstance(conn.sock, ssl.SSLSocket)
        if not conn.peeked and not self._peek_hello(conn):
            return False
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._wait_for(conn, selectors.EVENT_READ)
            return False
        except ssl.SSLWantWriteError:
            self._wait_for(conn, selectors.EVENT_READ | selectors.EVENT_WRITE)
            return False
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            if isinstance(exc, (ssl.SSLEOFError, ConnectionError)) or (
                    not isinstance(exc, ssl.SSLError) and exc.errno == errno.ENOTCONN):
                log.debug("%s: closed during the TLS handshake: %s", conn.address[0], exc)  # a TCP probe, a scan
                self._close(conn)
                return False
            self.tls_failures += 1
            why = getattr(exc, "reason", None) or exc
            self._warn("tls", "%s: TLS handshake failed, connection refused: %s", conn.address[0],
                       "a plain HTTP request on the HTTPS port" if why == "HTTP_REQUEST" else why)
            self._close(conn)
            return False
        conn.handshake = False
        self._wait_for(conn, selectors.EVENT_READ)
        return True

    def _recv(self, conn: _Conn) -> bytes:
        """What ``conn`` has sent (b"" when it closed); with TLS, with the bytes its SSL object holds decrypted,
        which the selector cannot see (SSLWantReadError when a whole TLS record has not arrived yet)."""
        data = conn.sock.recv(65536)
        if isinstance(conn.sock, ssl.SSLSocket):
            while data and (pending := conn.sock.pending()):
                data += conn.sock.recv(pending)
        return data

    def _read(self, conn: _Conn) -> None:
        if conn.handshake and not self._handshake(conn):
            return
        try:
            data = self._recv(conn)
        except (BlockingIOError, InterruptedError):
            return
        except ssl.SSLWantReadError:
            self._wait_for(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._wait_for(conn, selectors.EVENT_READ | selectors.EVENT_WRITE)
            return
        except OSError:
            self._close(conn)
            return
        if conn.events != selectors.EVENT_READ:
            self._wait_for(conn, selectors.EVENT_READ)
        if not data:
            self._close(conn)
            return
        if conn.state == "idle":
            self._wait_for_head(conn, time.monotonic())
        conn.buffer += data
        self._parse(conn, len(conn.buffer) - len(data))

    def _parse(self, conn: _Conn, start: int = 0) -> None:
        """Hand ``conn`` to a worker once its buffer holds a whole request line and headers."""
        found = HEAD_END.search(conn.buffer, max(0, start - 3))
        if found is None or found.end() > MAX_HEAD_BYTES:
            if len(conn.buffer) > MAX_HEAD_BYTES:
                with contextlib.suppress(OSError):
                    conn.sock.send(b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
                                   b"Connection: close\r\n\r\n")
                self._close(conn)
            return
        head, rest = bytes(conn.buffer[:found.end()]), bytes(conn.buffer[found.end():])
        conn.buffer, conn.hello = bytearray(), False
        if conn.reserved:
            self._promote(conn)
        self.selector.unregister(conn.sock)
        conn.state = "busy"
        conn.sock.settimeout(self.request_timeout)
        threading.Thread(target=self._answer, args=(conn, head, rest), name="exporter-request",
                         daemon=True).start()

    def _take_back(self) -> None:
        """Connections whose answer went out: closed, or waiting for their next request."""
        while self.returned:
            conn, keep, rest = self.returned.popleft()
            if not keep:
                self._close(conn)
                continue
            now = time.monotonic()
            conn.sock.setblocking(False)
            if conn.reserved and sum(not c.reserved for c in self.conns.values()) < \
                    self.max_connections - self.reserve:
                conn.reserved = False
            conn.state, conn.since, conn.deadline = "idle", now, now + self.request_timeout
            conn.events = selectors.EVENT_READ
            self.selector.register(conn.sock, selectors.EVENT_READ, conn)
            if rest:  # the next request came with this one
                self._wait_for_head(conn, now)
                conn.buffer = bytearray(rest)
                self._parse(conn)
            elif isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending():  # read, never seen by select
                self._read(conn)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self.conns.values() if c.state != "busy" and c.deadline <= now]:
            log.debug("closing %s: no %s in time", conn.address[0], "TLS handshake" if conn.handshake else "request")
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if self.conns.pop(conn.sock, None) is None:
            return
        if conn.state != "busy":
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn.sock)
        conn.sock.close()

    def _close_all(self) -> None:
        if self.closed:
            return
        self.closed = True
        with self.lock:
            self.stopping = True
            while self.returned:  # answered, not yet taken back
                self._close(self.returned.popleft()[0])
            for conn in list(self.conns.values()):
                if conn.state == "busy":  # its worker closes it; its answer is cut short
                    with contextlib.suppress(OSError):  # the socket's own (TLS's would drop its SSL object)
                        socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)
                else:
                    self._close(conn)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.listener)
        self.listener.close()
        self.selector.close()
        self.wake_r.close()
        self.wake_w.close()

    def _warn(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self.logged.get(kind, float("-inf")) > LOG_EVERY:
            log.warning(message, *args)
            self.logged[kind] = now

    # ---- the workers (a thread per request)

    def _answer(self, conn: _Conn, head: bytes, rest: bytes) -> None:
        keep = False
        try:
            handler = _Handler(conn.sock, conn.address, self, head)
            keep = not handler.close_connection and not _has_body(handler)
        except (ConnectionError, TimeoutError, ssl.SSLError) as exc:  # a scraper hanging up mid-answer is routine
            log.debug("client %s went away: %s", conn.address[0], exc)
        except Exception:
            log.exception("answering %s failed", conn.address[0])
        with self.lock:
            if self.stopping:
                conn.sock.close()
                return
            self.returned.append((conn, keep, rest))
        with contextlib.suppress(OSError):
            self.wake_w.send(b"\0")

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            self.wake_w.send(b"\0")


class ExporterServer:
    """Serves the registry and the state's probes on ``address:port`` from a background thread.

    ``fast``, when given, renders text format 0.0.4 for every scraper that accepts it (Prometheus does); other
    Accept headers get client_python's encoders. A client has ``header_timeout`` s to send a request's line and
    headers (in all, however slowly they trickle in), a kept-alive connection ``request_timeout`` s to start its
    next request, and an answer as long to be taken; then the connection is closed. At most
    ``max_connections`` are open at once, ``reserve`` of them kept for new connections (default: an eighth);
    see the module's docstring for who is closed when all are taken. With ``tls_cert_file`` and
    ``tls_key_file`` (PEM; both or neither) it serves HTTPS only; ValueError when they cannot be loaded; a
    renewed pair is loaded within ``tls_reload_check`` s (:class:`TLSFiles`).
    """

    def __init__(self, registry: CollectorRegistry, state: Probe, address: str = "0.0.0.0",
                 port: int = 9477, fast: Callable[[CollectorRegistry], bytes] | None = None,
                 request_timeout: float = REQUEST_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
                 header_timeout: float = HEADER_TIMEOUT, reserve: int | None = None,
                 tls_cert_file: str | None = None, tls_key_file: str | None = None,
                 tls_reload_check: float = TLS_RELOAD_CHECK):
        if not header_timeout > 0 or not request_timeout > 0:
            raise ValueError("header_timeout and request_timeout must be positive")
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        reserve = max_connections // 8 if reserve is None else reserve
        reserve = max(1, reserve) if max_connections > 1 else 0
        if reserve >= max_connections:
            raise ValueError("reserve must be below max_connections")
        if bool(tls_cert_file) != bool(tls_key_file):  # "" is not given, as an empty setting
            given = "tls_cert_file" if tls_cert_file else "tls_key_file"
            raise ValueError(f"TLS needs both tls_cert_file and tls_key_file, not {given} alone")
        tls = TLSFiles(tls_cert_file, tls_key_file, tls_reload_check) if tls_cert_file and tls_key_file else None
        try:
            self.httpd = _Server(address, port, registry, state, fast, header_timeout, request_timeout,
                                 max_connections, reserve, tls)
        except OSError as exc:  # port taken, address not local: say which, without a traceback
            raise OSError(exc.errno, f"cannot listen on {address}:{port}: {exc.strerror or exc}") from exc
        self._thread: threading.Thread | None = None

    @property
    def tls(self) -> bool:
        """Whether it serves HTTPS."""
        return self.httpd.tls is not None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self.httpd.server_address[0]
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "[::1]"
        elif ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve, name="exporter-http", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop serving: the port is closed, and so is every connection (a kept-alive one is not answered)."""
        self.httpd.stopping = True
        self.httpd.wake()
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self.httpd._close_all()


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
