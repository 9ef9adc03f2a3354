"""The options of the services' HTTP server (:class:`~dprobe.services.exporter.server.ExporterServer`), one group
in the settings of the sidecar and of the scaler: where it listens (``listen_address``, ``port``) and how it
treats slow clients and many connections (``web_*``; YAML ``web: {header_timeout: ...}``)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from dprobe.core.options import at_least, option, port_number, positive
from dprobe.services.exporter.server import HEADER_TIMEOUT, MAX_CONNECTIONS, REQUEST_TIMEOUT, tls_context


@dataclass
class WebOptions:
    """Each option is a keyword argument of ``ExporterServer`` (``server=`` in its metadata where the names
    differ): a new one is a new field here, passed on by :meth:`server_kwargs`."""

    listen_address: str = option("0.0.0.0", "address the HTTP server binds", name="listen_address", server="address")
    port: int = option(9477, "port of /metrics, /healthz and /readyz", name="port", check=port_number)
    header_timeout: float = option(HEADER_TIMEOUT, "seconds a client has to send a request's line and headers; "
                                                   "then its connection is closed, unanswered", check=positive)
    request_timeout: float = option(REQUEST_TIMEOUT, "seconds a kept-alive connection may wait for its next "
                                                     "request, and an answer to be taken", check=positive)
    max_connections: int = option(MAX_CONNECTIONS, "most connections open at once", check=at_least(1))
    reserved_connections: int | None = option(None, "how many of web_max_connections are kept for new "
                                                    "connections, which must send their request within a quarter "
                                                    "of web_header_timeout (unset: an eighth of them)",
                                              check=at_least(0), server="reserve")
    tls_cert_file: str | None = option(None, "PEM certificate (chain) to serve HTTPS with, with tls_key_file "
                                             "(unset: plain HTTP)", name="tls_cert_file")
    tls_key_file: str | None = option(None, "PEM private key of tls_cert_file", name="tls_key_file")

    def check(self) -> None:
        """What the server would refuse at its start, refused with the settings (ValueError naming the option)."""
        if self.reserved_connections is not None and 1 < self.max_connections <= self.reserved_connections:
            raise ValueError(f"web_reserved_connections ({self.reserved_connections}) must be below "
                             f"web_max_connections ({self.max_connections})")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            given = "tls_cert_file" if self.tls_cert_file else "tls_key_file"
            raise ValueError(f"HTTPS needs both tls_cert_file and tls_key_file, not {given} alone")
        if self.tls_cert_file and self.tls_key_file:
            tls_context(self.tls_cert_file, self.tls_key_file)  # a ValueError naming the file that cannot serve

    def server_kwargs(self) -> dict[str, Any]:
        """These options as ``ExporterServer``'s keyword arguments."""
        return {f.metadata.get("server", f.name): getattr(self, f.name) for f in fields(self)}
