"""A small HTTP GET used by the network sources and the scaler, turning every failure into :class:`SourceError`;
with :class:`HttpAuth`, the credentials and TLS settings of a secured server (bearer token, basic auth, CA,
client certificate, extra headers). Its timeout is a deadline: connecting (the TLS handshake included), sending
the request and reading the status, headers and body must all be done within it, however slowly the server
answers. A URL is shown without the password of its user info (:func:`redact_url`)."""

from __future__ import annotations

import base64
import functools
import http.client
import io
import os
import re
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from dprobe.core.options import USERINFO, redact_url
from dprobe.services.sources.base import SourceError

__all__ = ["HttpAuth", "http_get", "redact_url", "redact"]

MAX_BODY_BYTES = 64 * 1024 * 1024
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP token (RFC 9110)


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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Credentials never follow a redirect to wherever it points: the redirect is an error."""

    def redirect_request(self, *args, **kwargs):  # noqa: ANN002, ANN003
        return None


def _describe(exc: urllib.error.HTTPError, auth: HttpAuth | None) -> str:
    p = auth.prefix if auth else ""
    if exc.code == 401:
        if auth is None:  # a source without credential options (dcgm-exporter)
            return f"HTTP 401 {exc.reason}: the server wants credentials, no credentials given (this source sends none)"
        given = ("a bearer token" if auth.bearer_token_file else "basic auth" if auth.username else "no credentials")
        return (f"HTTP 401 {exc.reason}: the server wants credentials, {given} given "
                f"({p}bearer_token_file, or {p}username and {p}password_file)")
    if exc.code == 403:
        return f"HTTP 403 {exc.reason}: the credentials are not allowed to read this"
    if 300 <= exc.code < 400:
        return f"HTTP {exc.code} {exc.reason}: redirected to {exc.headers.get('Location')!r}, not followed"
    return f"HTTP {exc.code} {exc.reason}"


def _tls_hint(reason: object, auth: HttpAuth | None) -> str:
    p = auth.prefix if auth else ""
    if isinstance(reason, ssl.SSLCertVerificationError):
        return (f"TLS: the server's certificate was not verified ({reason.verify_message or reason}); "
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


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes, each read given only what is left until ``deadline`` (``time.monotonic()``)."""

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
    """An answer whose status line, headers and body must all have come by ``deadline``."""

    def __init__(self, sock: socket.socket, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp.close()
        self.fp = io.BufferedReader(_DeadlineReader(sock, deadline))


def _left(deadline: float) -> float:
    """Seconds left until ``deadline``; TimeoutError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


class _DeadlineConnection:
    """An http.client connection whose ``timeout`` bounds the whole request, from its creation: connecting
    (with the TLS handshake), sending, and reading the answer, each step given what is left of it."""

    timeout: float | None
    sock: socket.socket | None
    response_class: Any  # a partial of the response class, bound to this request's deadline

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.timeout is None:
            raise ValueError("a connection with a deadline needs a timeout")
        self.deadline = time.monotonic() + self.timeout
        self._create_connection = self._connect
        self.response_class = functools.partial(_DeadlineResponse, deadline=self.deadline)

    def _connect(self, address: tuple[str, int], timeout: float, source_address: Any = None) -> socket.socket:
        sock = socket.create_connection(address, _left(self.deadline), source_address)
        sock.settimeout(_left(self.deadline))  # what is left of it for the TLS handshake
        return sock

    def send(self, data: Any) -> None:
        if self.sock is not None:
            self.sock.settimeout(_left(self.deadline))
        super().send(data)  # type: ignore[misc]


class _HTTPConnection(_DeadlineConnection, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_DeadlineConnection, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: ssl.SSLContext | None = None) -> None:
        super().__init__(context=context)
        self.context = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPSConnection, req, context=self.context)


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
    headers = {"Accept": accept, "User-Agent": "dprobe"}
    if form is not None:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    context = None
    handlers: list[urllib.request.BaseHandler] = [_HTTPHandler()]
    if auth is not None and auth.configured:
        headers.update(auth.request_headers())
        handlers.append(_NoRedirect())
        if url.lower().startswith("https:"):
            context = auth.ssl_context()
    handlers.append(_HTTPSHandler(context))
    req = urllib.request.Request(url, data=form, headers=headers)
    try:
        opener = urllib.request.build_opener(*handlers)
        with opener.open(req, timeout=timeout) as resp:
            body = resp.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise SourceError(f"{url}: {_describe(exc, auth)}") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise SourceError(f"{url}: timed out after {timeout:g} s") from exc
        raise SourceError(f"{url}: {_tls_hint(exc.reason, auth)}") from exc
    except TimeoutError as exc:
        raise SourceError(f"{url}: timed out after {timeout:g} s") from exc
    except ssl.SSLError as exc:
        raise SourceError(f"{url}: {_tls_hint(exc, auth)}") from exc
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise SourceError(f"{url}: {exc}") from exc
    if len(body) > MAX_BODY_BYTES:
        raise SourceError(f"{url}: response larger than {MAX_BODY_BYTES} bytes")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{url}: response is not UTF-8 ({exc})") from exc
