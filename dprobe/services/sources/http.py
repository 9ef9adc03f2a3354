"""A small HTTP client of the network sources and the scaler: GET a URL (or POST a form) and return its body as
text, every failure a :class:`SourceError`; with :class:`HttpAuth`, the credentials and TLS settings of a secured
server (bearer token, basic auth, CA, client certificate, extra headers). Its timeout is a deadline: connecting
(the TLS handshake included), sending the request and reading the status, headers and body must all be done
within it, however slowly the server answers. A URL is shown without the password of its user info
(:func:`redact_url`).

urllib3 does the HTTP: connection pools (one :class:`urllib3.PoolManager` per :class:`HttpAuth`, and one for
clients without credentials, so that the connection to Prometheus stays open from one cycle to the next and
its TLS handshake is made once, not for every query), HTTP/1.1 framing (chunked bodies, Content-Length held
to), redirects (followed only by a client that sends no credentials), TLS through the :class:`ssl.SSLContext`
given, and proxies (``http_proxy`` / ``https_proxy`` / ``no_proxy`` of the environment, read by the standard
library as its client did); its own retries are off. Written here is only what it does not do:

- the whole-request deadline: urllib3's timeouts bound each socket operation, so a server sending a byte at
  a time would hold a request for as long as it likes; here connecting is given what is left of the
  deadline, the TLS handshake what is left after (CPython's handshake takes its socket's timeout as a deadline),
  and every send and every read of the status line, headers and body what is left then;
- the body cap (:data:`MAX_BODY_BYTES`), the body read in chunks;
- credentials read from their files again when these change, and the TLS context (with the pool of
  connections made with it) made again when the CA or certificate files change;
- one more try, on a new connection, of a request sent on a kept-alive connection that the server had closed
  meanwhile, answering nothing (an idle timeout racing the request; a query is safe to ask again); no other
  retry, callers retry on their own;
- errors in one line naming the option that would mend them, never with the URL's password (urllib3 wraps
  the error at fault in its own, and warns at every request ``insecure_skip_verify`` makes)."""

from __future__ import annotations

import base64
import contextlib
import contextvars
import http.client
import io
import os
import re
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError, MaxRetryError, NewConnectionError, ProtocolError
from urllib3.exceptions import TimeoutError as Urllib3Timeout
from urllib3.util import Retry, Timeout
from urllib3.util.ssl_match_hostname import CertificateError as HostnameMismatch

from dprobe.core.options import USERINFO, redact_url
from dprobe.services.sources.base import SourceError

__all__ = ["HttpAuth", "http_get", "redact_url", "redact"]

MAX_BODY_BYTES = 64 * 1024 * 1024
CHUNK_BYTES = 256 * 1024  # a body is read this much at a time, the deadline and the cap checked in between
ERROR_BODY_BYTES = 64 * 1024  # an error's body up to this is read (the connection kept), a longer one dropped
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP token (RFC 9110)
URLLIB3_V1 = urllib3.__version__.startswith("1.")
POOL_SIZE = 4  # connections kept open per server and client
FOLLOW = Retry(total=None, connect=0, read=0, status=0, other=0, redirect=10)  # redirects only (no credentials)


def _signature(path: str) -> tuple[int, int, int] | None:
    """What changes when a file is rewritten or swapped (Kubernetes swaps a projected volume's files)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class HttpAuth:
    """Credentials and TLS settings of a client; the files are read again when they change (a rotated token,
    a renewed certificate). ``prefix`` names the options in messages (``prometheus_`` -> ``prometheus_ca_file``).
    """

    def __init__(self, bearer_token_file: str = "", username: str = "", password_file: str = "",
                 ca_file: str = "", cert_file: str = "", key_file: str = "", insecure_skip_verify: bool = False,
                 headers: Mapping[str, str] | None = None, prefix: str = "") -> None:
        self.bearer_token_file, self.username, self.password_file = bearer_token_file, username, password_file
        self.ca_file, self.cert_file, self.key_file = ca_file, cert_file, key_file
        self.insecure_skip_verify, self.headers, self.prefix = insecure_skip_verify, dict(headers or {}), prefix
        self._files: dict[str, tuple[tuple[int, int, int] | None, str]] = {}
        self._context: tuple[tuple, ssl.SSLContext] | None = None
        self._lock = threading.Lock()
        self._managers: dict[str, tuple[ssl.SSLContext | None, urllib3.PoolManager]] = {}  # by proxy ("": none)

    @property
    def configured(self) -> bool:
        return bool(self.bearer_token_file or self.username or self.password_file or self.ca_file or self.cert_file
                    or self.key_file or self.insecure_skip_verify or self.headers)

    def check(self) -> None:
        """Refuse contradictory settings and unreadable files at start: a ValueError naming the option."""
        p = self.prefix
        if self.bearer_token_file and (self.username or self.password_file):
            raise ValueError(f"{p}bearer_token_file and {p}username/{p}password_file are two ways to authenticate: "
                             "set one")
        if bool(self.username) != bool(self.password_file):
            raise ValueError(f"basic auth needs both {p}username and {p}password_file")
        if self.key_file and not self.cert_file:
            raise ValueError(f"{p}key_file needs {p}cert_file (the client certificate)")
        if self.insecure_skip_verify and self.ca_file:
            raise ValueError(f"{p}insecure_skip_verify skips the verification {p}ca_file is for: set one")
        for name in ("bearer_token_file", "password_file", "ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path:
                try:
                    with open(path, "rb"):
                        pass
                except OSError as exc:
                    raise ValueError(f"{p}{name}: cannot read {path} ({exc.strerror or exc})") from exc
        for key, value in self.headers.items():
            if not HEADER_NAME.fullmatch(key):
                raise ValueError(f"{p}headers: {key!r} is not a valid header name")
            if any(c in str(value) for c in "\r\n\0"):
                raise ValueError(f"{p}headers: the value of {key} holds a line break")
            if key.lower() == "authorization" and (self.bearer_token_file or self.username):
                raise ValueError(f"{p}headers: Authorization is set by {p}bearer_token_file / {p}username already")
        if self.cert_file or self.ca_file:
            self.ssl_context(error=ValueError)  # a certificate that does not load is refused now

    def _read(self, name: str) -> str:
        """The stripped text of the file of option ``name``, read again when it changed; SourceError if it
        cannot be read or is empty."""
        path = getattr(self, name)
        sig = _signature(path)
        cached = self._files.get(path)
        if cached is None or sig is None or cached[0] != sig:
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read().strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise SourceError(f"{self.prefix}{name}: cannot read {path} ({getattr(exc, 'strerror', None) or exc})"
                                  ) from exc
            if not text:
                raise SourceError(f"{self.prefix}{name}: {path} is empty")
            self._files[path] = cached = (sig, text)
        return cached[1]

    def request_headers(self) -> dict[str, str]:
        """The headers that go with each request (credentials read from their files as they are now)."""
        out = {str(k): str(v) for k, v in self.headers.items()}
        if self.bearer_token_file:
            out["Authorization"] = "Bearer " + self._read("bearer_token_file")
        elif self.username:
            pair = f"{self.username}:{self._read('password_file')}".encode()
            out["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        return out

    def ssl_context(self, error: type[Exception] = SourceError) -> ssl.SSLContext:
        """The TLS settings of an https request, made again when the CA or certificate files change."""
        key = (self.insecure_skip_verify, *((path, _signature(path)) for path in (self.ca_file, self.cert_file,
                                                                                  self.key_file)))
        if self._context is not None and self._context[0] == key:
            return self._context[1]
        p = self.prefix
        try:
            ctx = ssl.create_default_context(cafile=self.ca_file or None)
        except (ssl.SSLError, OSError) as exc:
            raise error(f"{p}ca_file: {self.ca_file} is not a usable CA bundle ({exc})") from exc
        if self.insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_file:
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file or None)
            except (ssl.SSLError, OSError) as exc:
                raise error(f"{p}cert_file/{p}key_file: cannot load the client certificate {self.cert_file} "
                            f"({exc})") from exc
        self._context = (key, ctx)
        return ctx

    def pool_manager(self, https: bool, proxy: str = "") -> urllib3.PoolManager:
        """The connection pools of this client's requests (through ``proxy``, a proxy URL, where given): kept
        while the TLS context stays the same, made again (the former one's connections closed) when it changes."""
        context = self.ssl_context() if https else None
        if context is not None and URLLIB3_V1:  # it matches the host name itself (and gives OpenSSL no IP address)
            context.check_hostname = False
        with self._lock:
            current = self._managers.get(proxy)
            if current is None or (context is not None and context is not current[0]):
                if current is not None:
                    current[1].clear()
                kw: dict[str, Any] = {"num_pools": 8, "maxsize": POOL_SIZE, "block": False, "retries": False,
                                      "ssl_context": context}
                found = USERINFO.search(proxy)
                manager = urllib3.PoolManager(**kw) if not proxy else urllib3.ProxyManager(
                    proxy, proxy_headers=urllib3.make_headers(
                        proxy_basic_auth=urllib.parse.unquote(found.group(1))) if found else None, **kw)
                manager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
                self._managers[proxy] = current = (context, manager)
            return current[1]

    def close(self) -> None:
        """Close the connections kept alive (the next request opens a new one)."""
        with self._lock:
            for _, manager in self._managers.values():
                manager.clear()


# the deadline -----------------------------------------------------------------------------------------------
@dataclass
class _Call:
    """One call of :func:`http_get`: its deadline (``time.monotonic()``) and how many connections it opened
    (none: it went on a kept-alive one)."""

    deadline: float
    opened: int = 0


_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("dprobe_http_call", default=None)


def _left(deadline: float) -> float:
    """Seconds left until ``deadline``; TimeoutError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes, each read given only what is left until ``deadline``."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self.sock, self.deadline = sock, deadline
        self.raw = sock.makefile("rb", buffering=0)  # holds the socket open while the answer is read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self.sock.settimeout(_left(self.deadline))
        return self.raw.readinto(buffer)

    def close(self) -> None:
        if not self.closed:
            self.raw.close()
        super().close()


class _DeadlineResponse(http.client.HTTPResponse):
    """An answer whose status line, headers and body must all have come by the current call's deadline."""

    def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        call = _CALL.get()
        if call is not None:
            self.fp.close()
            self.fp = io.BufferedReader(_DeadlineReader(sock, call.deadline))


class _DeadlineConnection:
    """A urllib3 connection (the mixin of one) whose every step is given what is left of the current call's
    deadline: connecting, the TLS handshake, each send, and reading the answer (:class:`_DeadlineResponse`)."""

    response_class: Any = _DeadlineResponse
    timeout: Any
    sock: socket.socket | None

    def _new_conn(self) -> socket.socket:
        call = _CALL.get()
        if call is None:
            return super()._new_conn()  # type: ignore[misc]
        self.timeout = _left(call.deadline)
        sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        call.opened += 1
        try:
            sock.settimeout(_left(call.deadline))  # what is left of it for the TLS handshake
        except TimeoutError:
            sock.close()
            raise
        return sock

    def send(self, data: Any) -> None:
        call = _CALL.get()
        if call is not None and self.sock is not None:
            self.sock.settimeout(_left(call.deadline))
        super().send(data)  # type: ignore[misc]


class _HTTPConnection(_DeadlineConnection, HTTPConnection):
    pass


class _HTTPSConnection(_DeadlineConnection, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection

    def _validate_conn(self, conn: Any) -> None:
        context = self.conn_kw.get("ssl_context")
        if context is None or context.verify_mode != ssl.CERT_NONE:
            return super()._validate_conn(conn)
        if getattr(conn, "sock", None) is None:  # insecure_skip_verify: connect now, as urllib3 does, without its
            conn.connect()                       # warning at every request (the option says what it means)


# the request ------------------------------------------------------------------------------------------------
def http_get(url: str, timeout: float, accept: str = "text/plain", auth: HttpAuth | None = None,
             form: bytes | None = None) -> str:
    """GET ``url`` (POST ``form``, URL-encoded, where given) and return its body as text, all of it within
    ``timeout`` s (a deadline, not a limit per read); any network, TLS, HTTP or decoding failure is a SourceError
    (an HTTP 401 says which credentials were sent, a certificate that is not trusted which option trusts it),
    which never shows the URL's password."""
    try:
        return _get(url, timeout, accept, auth, form)
    except SourceError as exc:
        raise SourceError(redact(str(exc), url)) from exc.__cause__


def _get(url: str, timeout: float, accept: str, auth: HttpAuth | None, form: bytes | None = None) -> str:
    call = _Call(time.monotonic() + timeout)
    if USERINFO.search(url):
        p = auth.prefix if auth is not None else ""
        raise SourceError(f"{url}: credentials in a URL are not sent; " + (
            f"give them as {p}username and {p}password_file, or {p}bearer_token_file" if auth is not None
            else "this source sends none"))
    headers = {"Accept": accept, "User-Agent": "dprobe"}
    if form is not None:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    configured = auth is not None and auth.configured
    owner = auth if auth is not None and configured else _PLAIN
    if configured:
        headers.update(owner.request_headers())
    token = _CALL.set(call)
    try:
        manager = owner.pool_manager(url.lower().startswith("https:"), _proxy(url))
        for attempt in (1, 2):
            try:
                resp = manager.urlopen("GET" if form is None else "POST", url, body=form, headers=headers,
                                       timeout=Timeout(connect=_left(call.deadline), read=_left(call.deadline)),
                                       retries=False if configured else FOLLOW, redirect=not configured,
                                       preload_content=False)
                break
            except (ProtocolError, MaxRetryError) as exc:
                if attempt == 2 or call.opened or not _dropped(exc):
                    raise
        return _answer(resp, url, call.deadline, auth)
    except SourceError:
        raise
    except (HTTPError, OSError, ValueError, http.client.HTTPException) as exc:
        raise SourceError(f"{url}: {_failure(exc, timeout, auth)}") from exc
    finally:
        _CALL.reset(token)


def _proxy(url: str) -> str:
    """The proxy of ``url`` that the environment names (``http_proxy``, ``https_proxy`` but for the hosts of
    ``no_proxy``), as the standard library's client takes it; "" for none."""
    split = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(split.scheme.lower(), "")
    if not proxy or urllib.request.proxy_bypass(split.netloc):
        return ""
    return proxy if "://" in proxy else "http://" + proxy


def _answer(resp: Any, url: str, deadline: float, auth: HttpAuth | None) -> str:
    """The text of ``resp``'s body; SourceError for an answer that is not a success, too large, or not UTF-8."""
    if not 200 <= resp.status < 300:
        with contextlib.suppress(HTTPError, OSError, http.client.HTTPException):
            _read(resp, deadline, ERROR_BODY_BYTES)  # read, so that its connection serves the next request
        raise SourceError(f"{url}: {_describe(resp.status, resp.reason, resp.headers.get('Location'), auth)}")
    length = resp.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        _drop(resp)
        raise SourceError(f"{url}: response larger than {MAX_BODY_BYTES} bytes")
    body = _read(resp, deadline, MAX_BODY_BYTES)
    if body is None:
        raise SourceError(f"{url}: response larger than {MAX_BODY_BYTES} bytes")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{url}: response is not UTF-8 ({exc})") from exc


def _read(resp: Any, deadline: float, limit: int) -> bytearray | None:
    """``resp``'s body, read a chunk at a time by ``deadline``, its connection then given back to the pool;
    None, the connection closed, where it is longer than ``limit``."""
    body = bytearray()
    try:
        while True:
            _left(deadline)
            chunk = resp.read(CHUNK_BYTES)
            if not chunk:
                resp.release_conn()
                return body  # not copied: a large answer is held once, then as text
            body += chunk
            if len(body) > limit:
                _drop(resp)
                return None
    except BaseException:
        _drop(resp)
        raise


def _drop(resp: Any) -> None:
    """Close ``resp``'s connection (an answer not read to its end cannot serve another request)."""
    resp.close()
    resp.release_conn()


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the errors under it, outermost first: urllib3 wraps them (MaxRetryError's reason,
    ``ProtocolError("Connection aborted.", error)``, ``SSLError(ssl_error)``, ``raise ... from error``)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [x for x in (getattr(e, "reason", None), *e.args, e.__cause__, e.__context__)
                 if isinstance(x, BaseException)]


def _dropped(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection was closed before any answer (a kept-alive one the server closed)."""
    return any(isinstance(e, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError,
                              http.client.RemoteDisconnected, ssl.SSLEOFError)) for e in _chain(exc))


def _failure(exc: BaseException, timeout: float, auth: HttpAuth | None) -> str:
    """What went wrong, in a line: timed out, a TLS hint, else the innermost error's words."""
    chain = list(_chain(exc))
    if any(isinstance(e, TimeoutError) or (isinstance(e, Urllib3Timeout) and not isinstance(e, NewConnectionError))
           for e in chain):
        return f"timed out after {timeout:g} s"
    tls = next((e for e in chain if isinstance(e, (ssl.SSLError, HostnameMismatch))), None)
    if tls is not None:
        return _tls_hint(tls, auth)
    inner = next((e for e in chain if isinstance(e, (OSError, http.client.HTTPException))), exc)
    return str(inner) or type(inner).__name__


def _describe(status: int, reason: str, location: str | None, auth: HttpAuth | None) -> str:
    p = auth.prefix if auth else ""
    if status == 401:
        if auth is None:  # a source without credential options (dcgm-exporter)
            return f"HTTP 401 {reason}: the server wants credentials, no credentials given (this source sends none)"
        given = ("a bearer token" if auth.bearer_token_file else "basic auth" if auth.username else "no credentials")
        return (f"HTTP 401 {reason}: the server wants credentials, {given} given "
                f"({p}bearer_token_file, or {p}username and {p}password_file)")
    if status == 403:
        return f"HTTP 403 {reason}: the credentials are not allowed to read this"
    if 300 <= status < 400:
        return f"HTTP {status} {reason}: redirected to {location!r}, not followed"
    return f"HTTP {status} {reason}"


def _tls_hint(reason: object, auth: HttpAuth | None) -> str:
    p = auth.prefix if auth else ""
    if isinstance(reason, (ssl.SSLCertVerificationError, HostnameMismatch)):
        why = getattr(reason, "verify_message", None) or reason
        return (f"TLS: the server's certificate was not verified ({why}); "
                f"set {p}ca_file to the CA that signed it")
    if isinstance(reason, ssl.SSLError):
        why = str(getattr(reason, "reason", "") or "")
        if "ALERT" in why and "CERTIFICATE" in why:  # the server refused our certificate, or wants one
            return (f"TLS: the server refused the client certificate ({why.lower()}); mutual TLS needs "
                    f"{p}cert_file and {p}key_file of a certificate it trusts")
        return f"TLS: {reason}"
    return str(reason)


def redact(text: str, url: str) -> str:
    """``text`` (a message about ``url``) without the password of ``url``'s user info, wherever it shows it:
    in a URL (:func:`redact_url`), or in a part of one an error quotes (``nonnumeric port: 'pass@host'``)."""
    text = redact_url(text)
    found = USERINFO.search(url)
    if found:
        user, colon, password = found.group(1).partition(":")
        secret = password if colon else user  # user info without a password: a token
        for form in {secret, urllib.parse.unquote(secret)} - {""}:  # as written, and as an error decodes it
            text = text.replace(form, "xxxxx")
    return text


_PLAIN = HttpAuth()  # the client of requests without credentials or TLS settings
