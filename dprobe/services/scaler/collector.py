"""The scaler's Prometheus metrics, rendered at scrape time from its latest decisions."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from dprobe.core.names import (
    COLOCATION_PLAN,
    RECOMMENDED_GPU_FRACTION,
    RECOMMENDED_GPU_MEMORY,
    RECOMMENDED_GPUS,
    RECOMMENDED_MIG_PROFILE,
    RECOMMENDED_REPLICAS,
)
from dprobe.scaling.policy import Decision
from dprobe.services.exporter.collector import StateCollector
from dprobe.services.scaler.demand import VC_DATA_GPUS, VC_DATA_TIME
from dprobe.services.scaler.sharing import PLACEMENTS, SharePlan

WORKLOAD_LABELS = ["namespace", "workload"]
# the gauges with a sample per workload decided on data: (name, help, value of a decision; None: no sample)
WORKLOAD_GAUGES: list[tuple[str, str, Callable[[Decision], float | None]]] = [
    (RECOMMENDED_REPLICAS, "Replicas recommended for the workload.", lambda d: d.replicas),
    ("dprobe_scaler_desired_replicas", "Replicas the forecast alone asks for (before stabilisation "
                                       "and rate limits).", lambda d: d.desired),
    ("dprobe_scaler_current_replicas", "Replicas the decision started from.", lambda d: d.current),
    ("dprobe_scaler_demand_ratio", "Forecast demand: the workload's pods' predicted GPU utilisation, "
                                   "summed (pod-equivalents).", lambda d: d.demand),
    ("dprobe_scaler_missing_pods", "Pods the workload is expected to have without a usable forecast "
                                   "(counted as the HPA counts pods without metrics).", lambda d: d.missing),
]
# the counter with a sample per workload and direction that changed its replicas
SCALE_EVENTS = ("dprobe_scaler_scale_events", "Decisions that changed a workload's replicas, by direction.")
# the gauges with a sample per workload with an activation query: (name, help, index in (value, active))
ACTIVATION_GAUGES = [
    ("dprobe_scaler_activation_query_value", "Value of the workload's activation query.", 0),
    ("dprobe_scaler_active", "1 while the workload's activation query is above its threshold "
                             "(KEDA's scaler active), else 0.", 1),
]


class ScalerState(Protocol):
    """What the collector reads: implemented by :class:`~dprobe.services.scaler.service.Scaler`."""

    # read-only (properties), so that the scaler's own types (a Counter, a dict) satisfy them
    @property
    def vc_held_gpus(self) -> Mapping[str, int]: ...

    @property
    def vc_pending_gpus(self) -> Mapping[str, float]: ...

    @property
    def vc_last_data(self) -> Mapping[str, tuple[int, float]]: ...  # vc -> (GPUs held, Unix time) at its last decision

    @property
    def grouped_pods(self) -> Mapping[str, int]: ...  # pods put in a workload last cycle, by method: owner, name

    @property
    def errors_total(self) -> Mapping[str, int]: ...

    @property
    def last_cycle_at(self) -> float | None: ...

    @property
    def shares(self) -> SharePlan | None: ...  # the last cycle's GPU shares (None: sharing off, or no cycle yet)

    @property
    def publishing(self) -> bool: ...  # False on a replica that does not hold the Lease (leader election)

    @property
    def decisions(self) -> Mapping[tuple[str, str], Decision]: ...

    @property
    def vc_decisions(self) -> Mapping[str, Decision]: ...

    @property
    def events_total(self) -> Mapping[tuple[str, ...], int]: ...  # (namespace, workload, direction)

    @property
    def vc_events_total(self) -> Mapping[tuple[str, ...], int]: ...  # (vc, direction)

    @property
    def rejected_total(self) -> Mapping[str, int]: ...

    @property
    def activations(self) -> Mapping[tuple[str, str], tuple[float, bool]]: ...

    @property
    def answer_warnings_total(self) -> int: ...  # warnings Prometheus sent with its answers (partial responses)

    @property
    def horizon_missing_total(self) -> int: ...  # cycles without forecasts at horizon_seconds, others exported


def _escape(value: str) -> str:
    """A label value as the text format writes it."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _escape_help(doc: str) -> str:
    return doc.replace("\\", r"\\").replace("\n", r"\n")


class ScalerCollector(StateCollector):
    """``dprobe_recommended_replicas{namespace,workload}``, ``dprobe_recommended_gpus{vc}`` and the
    decisions behind them (demand, desired count, current count), scale events and errors."""

    def __init__(self, state: ScalerState) -> None:
        self.state = state
        self._label_texts: dict[tuple[str, str], str] = {}  # each workload's label text, as last written
        self._local = threading.local()  # .fast: collect() for render_text

    def collect(self) -> Iterator[Metric]:
        publishing = self.state.publishing
        yield self._leader(publishing)
        if publishing:
            yield from self._decisions()
        yield from self._counters()

    @staticmethod
    def _leader(publishing: bool) -> Metric:
        return GaugeMetricFamily("dprobe_scaler_leader", "1 while this replica publishes recommendations (it holds "
                                 "the leader election's Lease, or leader election is off), else 0.",
                                 value=1.0 if publishing else 0.0)

    def _decisions(self) -> Iterator[Metric]:
        """The recommendations and everything about them (only the leader's)."""
        if not getattr(self._local, "fast", False):  # (render_text writes them itself)
            yield from self._per_workload()
        yield from self._others()

    def _per_workload(self) -> Iterator[Metric]:
        """The families with a sample per workload (:data:`WORKLOAD_GAUGES`, :data:`ACTIVATION_GAUGES`)."""
        s = self.state
        decisions = sorted(dict(s.decisions).items())  # a copy: the loop swaps them
        for name, doc, value in WORKLOAD_GAUGES:
            fam = GaugeMetricFamily(name, doc, labels=WORKLOAD_LABELS)
            for (ns, workload), d in decisions:
                if not d.published:  # nothing before the first decision on data
                    continue
                v = value(d)
                if v is not None:
                    fam.add_metric([ns, workload], float(v))
            yield fam
        activations = sorted(dict(s.activations).items())
        for name, doc, pick in ACTIVATION_GAUGES:
            fam = GaugeMetricFamily(name, doc, labels=WORKLOAD_LABELS)
            for (ns, workload), row in activations:
                fam.add_metric([ns, workload], float(row[pick]))
            yield fam
        events = CounterMetricFamily(*SCALE_EVENTS, labels=[*WORKLOAD_LABELS, "direction"])
        for key, n in sorted(dict(s.events_total).items()):
            events.add_metric(list(key), n)
        yield events

    def render_text(self, registry: CollectorRegistry) -> bytes:
        """``registry``'s /metrics in text format 0.0.4 (the exporter's ``fast`` renderer), the families with a sample
        per workload written here directly (each workload's label text escaped once and kept while the workload is
        decided), the others by ``generate_latest``: the same samples, 20,000 workloads in a fraction of the time."""
        self._local.fast = True  # this thread's collect() leaves them out (another scrape's may be rendering them)
        try:
            rest = generate_latest(registry)
        finally:
            self._local.fast = False
        return rest + (self._per_workload_text().encode() if self.state.publishing else b"")

    def _per_workload_text(self) -> str:
        s = self.state
        decisions = sorted(dict(s.decisions).items())
        activations = sorted(dict(s.activations).items())
        known, texts = self._label_texts, {}

        def labels(key: tuple[str, str]) -> str:
            text = known.get(key)
            if text is None:
                text = ",".join(f'{k}="{_escape(v)}"' for k, v in zip(WORKLOAD_LABELS, key, strict=True))
            texts[key] = text
            return text

        shown: dict[float, str] = {}  # each value as written (counts repeat: written once)

        def number(v: float) -> str:
            text = shown.get(v)
            if text is None:
                text = shown[v] = floatToGoString(float(v))
            return text

        out: list[str] = []
        published = [(labels(key), d) for key, d in decisions if d.published]
        for name, doc, value in WORKLOAD_GAUGES:
            out.append(f"# HELP {name} {_escape_help(doc)}\n# TYPE {name} gauge\n")
            out.extend(f"{name}{{{text}}} {number(v)}\n" for text, d in published if (v := value(d)) is not None)
        rows = [(labels(key), row) for key, row in activations]
        for name, doc, pick in ACTIVATION_GAUGES:
            out.append(f"# HELP {name} {_escape_help(doc)}\n# TYPE {name} gauge\n")
            out.extend(f"{name}{{{text}}} {number(row[pick])}\n" for text, row in rows)
        name, doc = SCALE_EVENTS[0] + "_total", SCALE_EVENTS[1]
        out.append(f"# HELP {name} {_escape_help(doc)}\n# TYPE {name} counter\n")
        out.extend(f'{name}{{{labels(key[:2])},direction="{_escape(key[2])}"}} {number(n)}\n'
                   if len(key) == 3 else self._event_line(name, key, number(n))
                   for key, n in sorted(dict(s.events_total).items()))
        self._label_texts = texts  # this scrape's workloads only: the cache never outgrows them
        return "".join(out)

    @staticmethod
    def _event_line(name: str, key: tuple[str, ...], value: str) -> str:
        """A scale event's sample whose key is not (namespace, workload, direction): its values given to the labels
        in turn, as ``prometheus_client`` does."""
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in zip([*WORKLOAD_LABELS, "direction"], key, strict=False))
        return f"{name}{{{text}}} {value}\n"

    def _others(self) -> Iterator[Metric]:
        """The published families other than those per workload."""
        s = self.state
        vcs = dict(s.vc_decisions)
        per_vc = [
            (RECOMMENDED_GPUS, "GPUs recommended for the virtual cluster.", lambda d: d.replicas),
            ("dprobe_scaler_vc_demand_gpus", "Forecast GPU demand of the virtual cluster: its pods' predicted "
                                             "utilisation times their GPUs, summed, plus the GPUs waiting.",
             lambda d: d.demand),
            ("dprobe_scaler_vc_missing_gpus", "GPUs held by the virtual cluster's pods without a usable forecast.",
             lambda d: d.missing),
        ]
        shares = s.shares
        for name, doc, value in per_vc:
            fam = GaugeMetricFamily(name, doc, labels=["vc"])
            for vc, d in sorted(vcs.items()):
                if not d.published:
                    continue
                v = value(d)
                if v is not None:
                    fam.add_metric([vc], float(v))
            if name == RECOMMENDED_GPUS and shares is not None:  # beside {vc}: {vc,sharing="none"|"shared"}
                for vc, counts in sorted(shares.vc_gpus.items()):
                    for sharing, n in zip(("none", "shared"), counts, strict=True):
                        fam.samples.append(Sample(RECOMMENDED_GPUS, {"vc": vc, "sharing": sharing}, float(n)))
            yield fam
        if shares is not None:
            yield from self._shares(shares)
        last_gpus = GaugeMetricFamily(VC_DATA_GPUS, "GPUs the virtual cluster's pods held at its last decision on "
                                      "data (for restore_seconds after it: a restarted scaler reads them back).",
                                      labels=["vc"])
        last_time = GaugeMetricFamily(VC_DATA_TIME, "Unix time of the virtual cluster's last decision on data.",
                                      labels=["vc"])
        for vc, (n, at) in sorted(dict(s.vc_last_data).items()):
            last_gpus.add_metric([vc], n)
            last_time.add_metric([vc], at)
        yield last_gpus
        yield last_time
        held = GaugeMetricFamily("dprobe_scaler_vc_held_gpus", "GPUs the virtual cluster's pods hold.", labels=["vc"])
        for vc, n in sorted(dict(s.vc_held_gpus).items()):
            held.add_metric([vc], n)
        yield held
        pending = GaugeMetricFamily("dprobe_scaler_vc_pending_gpus", "GPUs waiting in the virtual cluster "
                                    "(vc_pending_query), counted in its demand.", labels=["vc"])
        for vc, waiting in sorted(dict(s.vc_pending_gpus).items()):
            pending.add_metric([vc], waiting)
        yield pending
        grouped = GaugeMetricFamily("dprobe_scaler_grouped_pods", "Pods put in a workload in the last cycle, by "
                                    "method: owner (kube-state-metrics' kube_pod_owner) or name (the workloads' "
                                    "pods patterns, for pods without a known owner).", labels=["method"])
        for method, n in sorted(dict(s.grouped_pods).items()):
            grouped.add_metric([method], n)
        yield grouped
        quota_events = CounterMetricFamily("dprobe_scaler_vc_scale_events", "Decisions that changed a virtual "
                                           "cluster's GPUs, by direction.", labels=["vc", "direction"])
        for key, n in sorted(s.vc_events_total.items()):
            quota_events.add_metric(list(key), n)
        yield quota_events
        if s.last_cycle_at is not None:  # the leader's only: a follower makes no decision (DprobeScalerStalled)
            yield GaugeMetricFamily("dprobe_scaler_last_cycle_timestamp_seconds",
                                    "Unix time of the last decision cycle.", value=s.last_cycle_at)

    def _counters(self) -> Iterator[Metric]:
        """What every replica exports: its errors, rejected forecasts, its last cycle."""
        s = self.state
        errors = CounterMetricFamily("dprobe_scaler_errors", "Failed cycle stages: query (Prometheus), "
                                     "no_data (an answer without a usable forecast while pods expected some), "
                                     "kubernetes (reading or setting a scale or quota), events (recording an "
                                     "Event), lease (reading or writing the leader election's Lease), recording_rules "
                                     "(recorded_series: the rules' series missing, or recorded for another "
                                     "horizon or quantile), cycle.",
                                     labels=["stage"])
        for stage, n in sorted(s.errors_total.items()):
            errors.add_metric([stage], n)
        yield errors
        rejected = CounterMetricFamily("dprobe_scaler_rejected_forecasts", "Forecasts left out as unusable: "
                                       "nan, infinite, negative, above_one (their pods count as missing); with "
                                       "sharing, memory forecasts: memory_nan, memory_infinite, memory_negative "
                                       "(their pods keep the GPUs they hold).", labels=["reason"])
        for reason, n in sorted(dict(s.rejected_total).items()):
            rejected.add_metric([reason], n)
        yield rejected
        yield CounterMetricFamily("dprobe_scaler_query_warnings", "Warnings Prometheus sent with its answers: a "
                                  "partial response of Thanos or Mimir (a store or ingester missing) or a query "
                                  "warning; decisions go on with what was answered.", value=s.answer_warnings_total)
        yield CounterMetricFamily("dprobe_scaler_horizon_missing", "Cycles whose answer held no forecast at the "
                                  "scaler's horizon_seconds while the sidecars exported other horizons (the log "
                                  "names them).", value=s.horizon_missing_total)

    @staticmethod
    def _shares(shares: SharePlan) -> Iterator[Metric]:
        """The GPU shares (sharing enabled): per workload, the co-location plan, and pods not packed."""
        per_workload = [
            (RECOMMENDED_GPU_MEMORY, "GPU memory limit recommended for each pod of the workload: its pods' largest "
                                     "memory forecast at the sharing memory quantile plus the margin (bytes).",
             lambda w: w.memory_bytes),
            (RECOMMENDED_GPU_FRACTION, "Share of one GPU recommended for each pod of the workload (0-1): its "
                                       "memory limit over the GPU's memory or its utilisation forecast, the "
                                       "larger (time-slicing, mps); the share its MIG profile takes (mig).",
             lambda w: w.fraction),
            ("dprobe_scaler_gpu_memory_forecast_bytes", "The workload's pods' largest memory forecast at the "
                                                        "sharing memory quantile, over the horizons up to the "
                                                        "scaler's (bytes).", lambda w: w.memory_forecast),
            ("dprobe_scaler_gpu_memory_share_bytes", "GPU memory the workload's pods can have: its limit, capped by "
                                                     "a whole GPU, its MIG profile and the GPU memory its pods see "
                                                     "now (bytes).", lambda w: w.share_bytes),
        ]
        for name, doc, value in per_workload:
            fam = GaugeMetricFamily(name, doc, labels=WORKLOAD_LABELS)
            for (ns, workload), share in sorted(shares.workloads.items()):
                v = value(share)
                if v is not None:
                    fam.add_metric([ns, workload], float(v))
            yield fam
        profiles = InfoMetricFamily(RECOMMENDED_MIG_PROFILE, "MIG profile recommended for each pod of the "
                                    "workload (mode mig).", labels=WORKLOAD_LABELS)
        for (ns, workload), share in sorted(shares.workloads.items()):
            if share.mig_profile:
                profiles.add_metric([ns, workload], {"profile": share.mig_profile})
        yield profiles
        plan = GaugeMetricFamily(COLOCATION_PLAN, "The co-location plan: pods of the workload ('' = pods in no "
                                 "workload) on GPU number gpu of the virtual cluster's plan.",
                                 labels=["vc", "gpu", *WORKLOAD_LABELS])
        for key, n in sorted(shares.colocation.items(), key=lambda kv: (kv[0][0], int(kv[0][1]), kv[0][2:])):
            plan.add_metric(list(key), n)
        yield plan
        pods = GaugeMetricFamily("dprobe_scaler_sharing_pods", "Pods of the virtual cluster by placement in the "
                                 "plan: shared, own_gpus (no memory forecast: it keeps the GPUs it holds) or "
                                 "cannot_place (too large, several GPUs, no allowed MIG profile: it keeps them too).",
                                 labels=["vc", "placement"])
        for vc in sorted({vc for vc, _ in shares.placements} - {""}):
            for placement in PLACEMENTS:
                pods.add_metric([vc, placement], shares.placements.get((vc, placement), 0))
        yield pods
        unplaced = GaugeMetricFamily("dprobe_scaler_unplaced_pods", "Pods not packed at their workload's share, "
                                     "by reason: no_memory_forecast, multi_gpu, too_large, no_profile (they keep "
                                     "the GPUs they hold).", labels=[*WORKLOAD_LABELS, "reason"])
        for reason_key, n in sorted(shares.unplaced.items()):
            unplaced.add_metric(list(reason_key), n)
        yield unplaced
