"""A small HTTP GET used by the network sources, turning every failure into :class:`SourceError`."""

from __future__ import annotations

import urllib.error
import urllib.request

from dprobe.services.sources.base import SourceError

MAX_BODY_BYTES = 64 * 1024 * 1024


def http_get(url: str, timeout: float, accept: str = "text/plain") -> str:
    """GET ``url`` and return its body as text; any network, HTTP or decoding failure is a SourceError."""
    req = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "dprobe-sidecar"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (configured URL)
            body = resp.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise SourceError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        raise SourceError(f"{url}: {exc.reason}") from exc
    except TimeoutError as exc:
        raise SourceError(f"{url}: timed out after {timeout:g} s") from exc
    except (OSError, ValueError) as exc:
        raise SourceError(f"{url}: {exc}") from exc
    if len(body) > MAX_BODY_BYTES:
        raise SourceError(f"{url}: response larger than {MAX_BODY_BYTES} bytes")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{url}: response is not UTF-8 ({exc})") from exc
