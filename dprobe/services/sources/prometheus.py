"""A Prometheus server as a source: ``query_range`` over the HTTP API, with its options
(:class:`PrometheusOptions`); and the options of any client of a Prometheus server (:class:`PrometheusAccess`:
credentials, TLS, headers), shared by the sidecar and the scaler."""

from __future__ import annotations

import json
import time
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass

from dprobe.core.options import option
from dprobe.services.sources.base import IDENTITY_LABELS, Sample, SourceError, target_name
from dprobe.services.sources.http import HttpAuth, http_get, redact_url
from dprobe.services.sources.registry import SourceContext, register

DEFAULT_MEMORY_QUERY = "sum by (namespace, pod) (DCGM_FI_DEV_FB_USED{pod!=\"\"}) * 1048576"
DEFAULT_UTILIZATION_QUERY = "avg by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{pod!=\"\"}) / 100"


AUTH_FIELDS = ("bearer_token_file", "username", "password_file", "ca_file", "cert_file", "key_file",
               "insecure_skip_verify", "headers")


@dataclass
class PrometheusAccess:
    """How a service reads a secured Prometheus (or Thanos, Mimir, Cortex): an option group, ``prometheus_*`` in
    the settings of every service that reads one (beside its ``url``)."""

    bearer_token_file: str = option(
        "", "file holding a bearer token sent to Prometheus (read again when it changes, as Kubernetes rotates "
            "projected service-account tokens)")
    username: str = option("", "basic auth user name for Prometheus (with prometheus_password_file)")
    password_file: str = option("", "file holding the basic auth password (read again when it changes)")
    ca_file: str = option("", "CA certificates (PEM) that verify Prometheus's TLS certificate (default: the system's)")
    cert_file: str = option("", "client certificate (PEM) for mutual TLS, with its key in it or in "
                                "prometheus_key_file")
    key_file: str = option("", "private key (PEM) of prometheus_cert_file")
    insecure_skip_verify: bool = option(False, "do not verify Prometheus's TLS certificate (tests only: anyone in "
                                               "between can read and answer)")
    headers: dict[str, str] = option({}, "extra HTTP headers of every Prometheus request, e.g. {X-Scope-OrgID: "
                                         "team-a} for a Mimir / Thanos tenant (YAML, or JSON in env)",
                                     secret=True)  # an Authorization header is a credential: errors never show it

    def auth(self) -> HttpAuth:
        """The client settings of these options (one object while they stay the same, so that the files it
        reads are read again only when they change)."""
        values = tuple((name, repr(getattr(self, name))) for name in AUTH_FIELDS)
        cached = self.__dict__.get("_auth")
        if cached is None or cached[0] != values:
            auth = HttpAuth(**{name: getattr(self, name) for name in AUTH_FIELDS}, prefix="prometheus_")
            self.__dict__["_auth"] = cached = (values, auth)
        return cached[1]

    def check_access(self, url: str) -> None:
        """Refuse at start what cannot work (ValueError naming the option): contradictory or unreadable
        credentials, a certificate that does not load, TLS settings on an http:// URL."""
        self.auth().check()
        tls = [n for n in ("ca_file", "cert_file", "insecure_skip_verify") if getattr(self, n)]
        if tls and not url.lower().startswith("https:"):
            raise ValueError(f"prometheus_{tls[0]} is for an https:// server, prometheus_url is {redact_url(url)!r}")


@dataclass
class PrometheusOptions(PrometheusAccess):
    """The options of the ``prometheus`` source (``prometheus_*``; YAML ``prometheus: {url: ...}``): the server,
    its credentials and TLS settings, and the queries read."""

    url: str = option("http://127.0.0.1:9090", "Prometheus server to read from")
    memory_query: str = option("", "PromQL for memory bytes per target (default: from DCGM_FI_DEV_FB_USED)")
    utilization_query: str = option("", "PromQL for utilisation 0-1 per target (default: DCGM_FI_DEV_GPU_UTIL)")
    target_label: str = option("", "label naming the target (default: namespace/pod, else UUID)")


POST_ABOVE = 4096  # bytes of URL-encoded parameters above which they are POSTed (proxies cap a URL's length)


def api_get(url: str, endpoint: str, params: dict[str, str], timeout: float, kind: str,
            auth: HttpAuth | None = None, warnings: list[str] | None = None) -> list:
    """The ``result`` list of ``GET {url}/api/v1/{endpoint}`` (a Prometheus server; POST, as the API allows, for
    parameters longer than :data:`POST_ABOVE`) when it answers with a ``kind`` (vector, matrix); any failure, an
    answer not shaped as the API's included, is a SourceError naming the server (without a password) and the
    query as written. The answer's ``warnings`` (a partial response of Thanos, Mimir) are added to ``warnings``."""
    encoded = urllib.parse.urlencode(params)
    base = f"{url.rstrip('/')}/api/v1/{endpoint}"
    full = f"{base}?{encoded}" if len(encoded) <= POST_ABOVE else base
    where = f"{redact_url(url)}: {params.get('query', '')!r}"
    try:
        body = http_get(full, timeout, accept="application/json", auth=auth,
                        form=None if full != base else encoded.encode())
    except SourceError as exc:  # the query as written, not URL-encoded
        raise SourceError(f"{where}: {str(exc).removeprefix(redact_url(full) + ': ')}") from exc
    try:
        doc = json.loads(body)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{where}: answer is not JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("status") != "success":
        err = doc.get("error") if isinstance(doc, dict) else None
        raise SourceError(f"{where}: query failed: {err or 'unexpected answer'}")
    data = doc.get("data") or {}
    if not isinstance(data, dict):
        raise SourceError(f"{where}: expected a {kind}, got data of type {type(data).__name__}")
    if data.get("resultType") != kind:
        raise SourceError(f"{where}: expected a {kind}, got {data.get('resultType')!r}")
    result = data.get("result") or []
    if not isinstance(result, list):
        raise SourceError(f"{where}: expected a {kind}, got a result of type {type(result).__name__}")
    if warnings is not None and isinstance(doc.get("warnings"), list):
        warnings.extend(str(w) for w in doc["warnings"])
    return result


def query_vector(url: str, query: str, timeout: float, auth: HttpAuth | None = None,
                 warnings: list[str] | None = None) -> list[tuple[dict[str, str], float]]:
    """An instant ``query`` at ``url`` (a Prometheus server): ``[(labels, value), ...]``, SourceError
    on any failure (unreachable, refused, wrong credentials, refused query, not an instant vector); the answer's
    warnings (partial responses) are added to ``warnings``."""
    rows = api_get(url, "query", {"query": query}, timeout, "vector", auth, warnings)
    try:
        return [(dict(s.get("metric", {})), float(s["value"][1])) for s in rows]
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise SourceError(f"{redact_url(url)}: {query!r}: malformed vector ({exc})") from exc


class PrometheusSource:
    """Reads memory (bytes) and utilisation (0-1) series from a Prometheus server.

    Each poll asks for the points since the previous poll (the first one
    backfills ``lookback`` seconds), so a restarted sidecar starts with history;
    the range never starts after it ends, whatever the timestamps of the answers.
    Targets are named from the series' labels (``namespace/pod``, else ``UUID``,
    or the label given as ``target_label``).
    """

    name = "prometheus"
    max_points = 10_000  # per series and query: Prometheus refuses more than 11,000 (a longer span is split)

    def __init__(self, url: str, memory_query: str = DEFAULT_MEMORY_QUERY,
                 utilization_query: str = DEFAULT_UTILIZATION_QUERY, step: float = 10.0,
                 lookback: float = 3600.0, timeout: float = 3.0, target_label: str | None = None,
                 auth: HttpAuth | None = None):
        self.url, self.auth = url.rstrip("/"), auth
        self.queries = {"memory": memory_query, "utilization": utilization_query}
        self.step, self.lookback, self.timeout, self.target_label = step, lookback, timeout, target_label
        self._since: float | None = None

    def _range(self, query: str, start: float, end: float) -> list:
        """``query_range`` from ``start`` to ``end``: ``[(labels, [(ts, value), ...]), ...]``, asked in spans
        of at most :attr:`max_points` steps (a long window at a short step would exceed Prometheus's limit)."""
        span = self.step * (self.max_points - 1)
        series: dict[tuple, tuple[dict[str, str], list]] = {}
        t = start
        while True:
            stop = min(end, t + span)
            for labels, values in self._range_once(query, t, stop):
                series.setdefault(tuple(sorted(labels.items())), (labels, []))[1].extend(values)
            t = stop + self.step  # the next point of the same grid
            if t > end:
                return list(series.values())

    def _range_once(self, query: str, start: float, end: float) -> list:
        """One ``query_range``: ``[(labels, [(ts, value), ...]), ...]``."""
        params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{self.step:g}"}
        series = api_get(self.url, "query_range", params, self.timeout, "matrix", self.auth)
        try:
            return [(dict(s.get("metric", {})), [(float(t), float(v)) for t, v in s.get("values", [])])
                    for s in series]
        except (TypeError, ValueError, AttributeError) as exc:
            raise SourceError(f"{redact_url(self.url)}: {query!r}: malformed matrix ({exc})") from exc

    def _target(self, labels: dict[str, str]) -> str | None:
        if self.target_label:
            return labels.get(self.target_label) or None
        return target_name(labels)

    def poll(self) -> list[Sample]:
        end = time.time()
        start = end - self.lookback if self._since is None else self._since + 1e-3
        start = min(max(start, end - self.lookback), end)  # never after end (Prometheus refuses it)
        points: dict[tuple[str, float], dict[str, float]] = defaultdict(dict)
        labels_of: dict[str, dict[str, str]] = {}
        for kind, query in self.queries.items():
            if not query:
                continue
            for labels, values in self._range(query, start, end):
                target = self._target(labels)
                if target is None:
                    continue
                labels_of.setdefault(target, labels)
                for ts, v in values:  # NaN and impossible values too: the sidecar counts and drops them
                    points[(target, ts)][kind] = v
        if points:  # a point stamped after now (a server clock ahead) must not move the next start past end
            self._since = min(max(ts for _, ts in points), end)
        return [
            Sample(target=t, ts=ts, memory_bytes=v.get("memory"), utilization_ratio=v.get("utilization"),
                   labels={k: labels_of[t][k] for k in IDENTITY_LABELS if k in labels_of[t]},
                   gpu_model=labels_of[t].get("modelName", ""))
            for (t, ts), v in sorted(points.items(), key=lambda kv: kv[0][1])
        ]

    def close(self) -> None:
        pass


    @classmethod
    def from_options(cls, options: PrometheusOptions, context: SourceContext) -> PrometheusSource:
        """The source of ``options``, at the sidecar's step, backfilling its window."""
        return cls(options.url, options.memory_query or DEFAULT_MEMORY_QUERY,
                   options.utilization_query or DEFAULT_UTILIZATION_QUERY, step=context.step_seconds,
                   lookback=context.window_seconds, timeout=context.http_timeout,
                   target_label=options.target_label or None, auth=options.auth())


register("prometheus", PrometheusSource.from_options)
