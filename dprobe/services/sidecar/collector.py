"""A client_python custom collector rendering the sidecar's latest samples and forecasts at scrape time, and
the fast text renderer of its /metrics."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from dprobe.core import names
from dprobe.services.exporter.collector import StateCollector
from dprobe.services.sidecar.state import ForecastSnapshot, JobRow, Latest, SidecarState
from dprobe.services.sources.base import IDENTITY_LABELS

# (name, help) by the forecast metric
PREDICTED = {
    "gpu_memory_bytes": (names.PREDICTED["gpu_memory_bytes"],
                         "Forecast GPU memory used by the target, by horizon and quantile (bytes)."),
    "gpu_utilization_ratio": (names.PREDICTED["gpu_utilization_ratio"],
                              "Forecast GPU utilisation of the target, by horizon and quantile (0-1)."),
}
# (name, help) by the reading (see _readings): the forecast metrics', then the sources' further readings
OBSERVED = {
    "gpu_memory_bytes": (names.OBSERVED["gpu_memory_bytes"], "Latest GPU memory used by the target (bytes)."),
    "gpu_utilization_ratio": (names.OBSERVED["gpu_utilization_ratio"],
                              "Latest GPU utilisation of the target (0-1)."),
    "memory_total_bytes": (names.OBSERVED["memory_total_bytes"], "GPU memory of the target's GPUs, summed over "
                                                                 "them (bytes; NVML, dcgm-exporter)."),
    "power_watts": (names.OBSERVED["power_watts"], "Latest power draw of the target's GPUs, summed over them "
                                                   "(watts; NVML, dcgm-exporter)."),
    "sm_clock_hertz": (names.OBSERVED["sm_clock_hertz"], "Latest SM clock of the target's GPU (hertz; NVML)."),
}
AGE = (names.LAST_SAMPLE_AGE, "Seconds since the target's last sample.")
# an info metric, dprobe_forecast_workload_info{target labels, token}: one series a forecast target (its token
# a label of its own series, not of the forecasts', whose series then stay the same when the token changes)
WORKLOAD_TOKEN = ("dprobe_forecast_workload", "The workload token the target's forecasts used: graph (its "
                  "model graph's GNN embedding and hand-made vector), vector (the vector alone) or unknown (the "
                  "unknown-workload embedding: no graph, or its embedding not there yet).")
JOB_PREDICTED = {
    "gpu_memory_bytes": "Cold-start prediction of the GPU memory the target's training job holds per GPU while it "
                        "trains, as NVML / DCGM show it, by quantile (bytes).",
    "allocator_peak_bytes": "Cold-start prediction of the training peak of the job's PyTorch allocator per GPU, "
                            "by quantile (bytes).",
    "gpu_utilization_ratio": "Cold-start prediction of the job's GPU utilisation while it trains, by quantile (0-1).",
    "step_seconds": "Cold-start prediction of the job's training step time, by quantile (seconds).",
}
JOB_INFO_LABELS = ["model", "batch", "precision", "optimizer", "gpu", "fits", "method", "gpu_spec"]
# every per-target series: the target, then its identity labels as the source gave them (dcgm-exporter's
# names), so that PromQL can join on(namespace, pod) or on(UUID). Labels a target lacks are exported
# empty rather than left out: scraped with honor_labels, an absent label would take the scraped pod's value.
TARGET_LABELS = ["target", *IDENTITY_LABELS]


def _identity(target: str, labels: Mapping[str, str] | None) -> list[str]:
    labels = labels or {}
    return [target, *(str(labels.get(k) or "") for k in IDENTITY_LABELS)]


def _readings(s: Latest) -> Iterator[tuple[str, float]]:
    """A target's latest readings that are exported, by their key in :data:`OBSERVED`."""
    if s.memory_bytes is not None:
        yield "gpu_memory_bytes", s.memory_bytes
    if s.utilization_ratio is not None:
        yield "gpu_utilization_ratio", s.utilization_ratio
    for key, value in s.extra.items():
        if key in OBSERVED:
            yield key, value


def _label_text(values: list[str]) -> str:
    """``target="…",gpu="…",…`` for :data:`TARGET_LABELS` values (escaped)."""
    return ",".join(f'{k}="{_escape(v)}"' for k, v in zip(TARGET_LABELS, values, strict=True))


def _fmt_q(q: float) -> str:
    return f"{q:g}"


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _header(name: str, doc: str, kind: str = "gauge") -> str:
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


class _Families:
    """Adapter so ``generate_latest`` can render a list of families and other collectors."""

    def __init__(self, families: list[Metric], others: Iterable[Collector]):
        self.families, self.others = families, others

    def collect(self) -> Iterator[Metric]:
        yield from self.families
        for c in self.others:
            yield from c.collect()


class SidecarCollector(StateCollector):
    """Renders observed values, forecasts, staleness, source errors and model info at scrape time.

    A target whose last sample is older than ``stale_after`` shows only its
    ``dprobe_last_sample_age_seconds``; a forecast older than
    ``forecast_max_age`` is not shown at all (never a stale forecast as fresh).
    ``collect()`` serves any client_python exposition; ``render_text()`` is the
    fast path of /metrics (text format 0.0.4), rendering each forecast
    snapshot's lines once and only filtering them per scrape.
    """

    def __init__(self, state: SidecarState, clock: Callable[[], float] = time.time):
        self.state, self.clock = state, clock
        self._prepared: tuple[ForecastSnapshot | None, dict[str, dict[str, str]]] = (None, {})
        self._lock = threading.Lock()
        self._label_texts: dict[str, tuple[Mapping[str, str], str]] = {}  # target -> (its labels, their text)

    def _fresh(self, now: float) -> tuple[dict[str, Latest], set[str]]:
        latest = self.state.latest_samples()
        return latest, {t for t, s in latest.items() if now - s.ts <= self.state.stale_after}

    def _live_snapshot(self, now: float) -> ForecastSnapshot | None:
        snap = self.state.forecast_snapshot()
        if snap is None or now - snap.made_at > self.state.forecast_max_age:
            return None
        return snap

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        latest, fresh = self._fresh(now)
        yield from self._observed(now, latest, fresh)
        snap = self._live_snapshot(now)
        for metric, (name, doc) in PREDICTED.items():
            fam = GaugeMetricFamily(name, doc, labels=[*TARGET_LABELS, "horizon_seconds", "quantile"])
            if snap is not None and metric in snap.quantiles:
                q = snap.quantiles[metric]
                hs = [str(h) for h in snap.horizons]
                qs = [_fmt_q(x) for x in snap.levels]
                for i, target in enumerate(snap.targets):
                    if target not in fresh:
                        continue
                    ident = _identity(target, snap.labels[i] if snap.labels else None)
                    for j, h in enumerate(hs):
                        for k, ql in enumerate(qs):
                            v = q[i, j, k]
                            if v == v:  # skip NaN
                                fam.add_metric([*ident, h, ql], float(v))
            yield fam
        tokens = InfoMetricFamily(*WORKLOAD_TOKEN, labels=TARGET_LABELS)
        if snap is not None:
            for i, (target, token) in enumerate(zip(snap.targets, snap.tokens, strict=False)):
                if target in fresh:
                    tokens.add_metric(_identity(target, snap.labels[i] if snap.labels else None), {"token": token})
        yield tokens
        yield from self._light(latest, fresh)

    def _observed(self, now: float, latest: dict[str, Latest], fresh: set[str]) -> Iterator[Metric]:
        age = GaugeMetricFamily(*AGE, labels=TARGET_LABELS)
        observed = {key: GaugeMetricFamily(name, doc, labels=TARGET_LABELS) for key, (name, doc) in OBSERVED.items()}
        for target, s in latest.items():
            ident = _identity(target, s.labels)
            age.add_metric(ident, max(0.0, now - s.ts))
            if target in fresh:
                for key, value in _readings(s):
                    observed[key].add_metric(ident, value)
        yield age
        yield from observed.values()

    def _light(self, latest: dict[str, Latest], fresh: set[str]) -> Iterator[Metric]:
        st = self.state
        errors = CounterMetricFamily(names.SOURCE_ERRORS, "Failed polls of a metric source.", labels=["source"])
        up = GaugeMetricFamily("dprobe_source_up", "1 when the source's last poll succeeded.", labels=["source"])
        rejected = CounterMetricFamily("dprobe_rejected_samples", "Readings of a source refused as NaN (missing), "
                                       "impossible or stamped in the future, by reason.", labels=["source", "reason"])
        for s in st.source_status():
            errors.add_metric([s.name], s.errors_total)
            up.add_metric([s.name], 1.0 if s.up else 0.0)
            for reason, n in s.rejected.items():
                rejected.add_metric([s.name, reason], n)
        yield errors
        yield up
        yield rejected
        yield CounterMetricFamily("dprobe_forecast_errors", "Forecast cycles that failed.",
                                  value=st.forecast_errors())
        yield InfoMetricFamily(names.MODEL_INFO, "The forecasting model in use.", value=st.model_labels())
        tracked = GaugeMetricFamily("dprobe_targets", "Targets tracked by the sidecar, by state.", labels=["state"])
        tracked.add_metric(["fresh"], len(fresh))
        tracked.add_metric(["stale"], len(latest) - len(fresh))
        yield tracked
        yield from self._jobs(st.job_rows(latest, fresh))

    @staticmethod
    def _jobs(rows: list[JobRow]) -> Iterator[Metric]:
        families = {stem: GaugeMetricFamily(names.JOB_PREDICTED[stem], doc, labels=[*TARGET_LABELS, "quantile"])
                    for stem, doc in JOB_PREDICTED.items()}
        info = InfoMetricFamily(names.JOB_INFO, "The training job a target runs, as its cold-start profile reads it; "
                                "fits: whether it fits the GPU's memory (yes, maybe, no); method: the prediction's; "
                                "gpu_spec: the spec file of the GPU's figures ('': built in).",
                                labels=TARGET_LABELS)
        for row in rows:
            ident = _identity(row.target, row.labels)
            for stem, by_quantile in row.values.items():
                for q, v in by_quantile.items():
                    families[stem].add_metric([*ident, q], v)
            info.add_metric(ident, {k: str(row.info.get(k, "")) for k in JOB_INFO_LABELS})
        yield from families.values()
        yield info

    # fast path ------------------------------------------------------------------------------------
    def prepare(self, snap: ForecastSnapshot | None) -> dict[str, dict[str, str]]:
        """Render a snapshot's predicted lines once (called by the forecast loop after publishing)."""
        with self._lock:
            if self._prepared[0] is snap:
                return self._prepared[1]
        blocks: dict[str, dict[str, str]] = {}
        if snap is not None:
            hs = [str(h) for h in snap.horizons]
            qs = [_fmt_q(x) for x in snap.levels]
            for metric, (name, _) in PREDICTED.items():
                q = snap.quantiles.get(metric)
                per: dict[str, str] = {}
                if q is not None:
                    for i, target in enumerate(snap.targets):
                        t = _label_text(_identity(target, snap.labels[i] if snap.labels else None))
                        lines = [f'{name}{{{t},horizon_seconds="{h}",quantile="{ql}"}} {floatToGoString(q[i, j, k])}\n'
                                 for j, h in enumerate(hs) for k, ql in enumerate(qs) if q[i, j, k] == q[i, j, k]]
                        per[target] = "".join(lines)
                blocks[metric] = per
            blocks[WORKLOAD_TOKEN[0]] = {
                target: f'{WORKLOAD_TOKEN[0]}_info{{{_label_text(_identity(target, snap.labels[i] if snap.labels else None))},'
                        f'token="{_escape(token)}"}} 1.0\n'
                for i, (target, token) in enumerate(zip(snap.targets, snap.tokens, strict=False))}
        with self._lock:
            self._prepared = (snap, blocks)
        return blocks

    def render_text(self, others: Iterable[Collector] = ()) -> bytes:
        """/metrics in text format 0.0.4; ``others`` (e.g. the latency histogram) are appended."""
        now = self.clock()
        latest, fresh = self._fresh(now)
        out: list[str] = []
        out.append(_header(*AGE))
        obs = {m: [_header(*OBSERVED[m])] for m in OBSERVED}
        texts, known = {}, self._label_texts  # each target's label text, escaped again only when its labels change
        for target, s in latest.items():
            cached = known.get(target)
            if cached is not None and (cached[0] is s.labels or cached[0] == s.labels):
                t = cached[1]
            else:
                t = _label_text(_identity(target, s.labels))
            texts[target] = (s.labels, t)
            out.append(f'{AGE[0]}{{{t}}} {floatToGoString(max(0.0, now - s.ts))}\n')
            if target in fresh:
                for key, value in _readings(s):
                    obs[key].append(f'{OBSERVED[key][0]}{{{t}}} {floatToGoString(value)}\n')
        self._label_texts = texts  # the targets of this scrape only: the cache never outgrows them
        for lines in obs.values():
            out.extend(lines)
        snap = self._live_snapshot(now)
        blocks = self.prepare(snap) if snap is not None else {}
        for metric, (name, doc) in PREDICTED.items():
            out.append(_header(name, doc))
            per = blocks.get(metric, {})
            out.extend(block for target, block in per.items() if target in fresh)
        out.append(_header(f"{WORKLOAD_TOKEN[0]}_info", WORKLOAD_TOKEN[1]))
        out.extend(line for target, line in blocks.get(WORKLOAD_TOKEN[0], {}).items() if target in fresh)
        text = "".join(out).encode()
        return text + generate_latest(_Families(list(self._light(latest, fresh)), others))
