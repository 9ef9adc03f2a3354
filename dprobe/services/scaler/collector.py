"""The scaler's Prometheus metrics, rendered at scrape time from its latest decisions."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from dprobe.core.names import RECOMMENDED_GPUS, RECOMMENDED_REPLICAS
from dprobe.services.exporter.collector import StateCollector
from dprobe.services.scaler.policy import Decision

WORKLOAD_LABELS = ["namespace", "workload"]


class ScalerState(Protocol):
    """What the collector reads: implemented by :class:`~dprobe.services.scaler.service.Scaler`."""

    vc_held_gpus: Mapping[str, int]
    vc_pending_gpus: Mapping[str, float]
    errors_total: Mapping[str, int]
    last_cycle_at: float | None

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


class ScalerCollector(StateCollector):
    """``dprobe_recommended_replicas{namespace,workload}``, ``dprobe_recommended_gpus{vc}`` and the
    decisions behind them (demand, desired count, current count), scale events and errors."""

    def __init__(self, state: ScalerState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        s = self.state
        decisions, vcs = dict(s.decisions), dict(s.vc_decisions)  # copies: the loop swaps them
        per_workload = [
            (RECOMMENDED_REPLICAS, "Replicas recommended for the workload.", lambda d: d.replicas),
            ("dprobe_scaler_desired_replicas", "Replicas the forecast alone asks for (before stabilisation "
                                               "and rate limits).", lambda d: d.desired),
            ("dprobe_scaler_current_replicas", "Replicas the decision started from.", lambda d: d.current),
            ("dprobe_scaler_demand_ratio", "Forecast demand: the workload's pods' predicted GPU utilisation, "
                                           "summed (pod-equivalents).", lambda d: d.demand),
            ("dprobe_scaler_missing_pods", "Pods the workload is expected to have without a usable forecast "
                                           "(counted as the HPA counts pods without metrics).", lambda d: d.missing),
        ]
        for name, doc, value in per_workload:
            fam = GaugeMetricFamily(name, doc, labels=WORKLOAD_LABELS)
            for (ns, workload), d in sorted(decisions.items()):
                if not d.published:  # nothing before the first decision on data
                    continue
                v = value(d)
                if v is not None:
                    fam.add_metric([ns, workload], float(v))
            yield fam
        activations = dict(s.activations)
        for name, doc, pick in (
                ("dprobe_scaler_activation_query_value", "Value of the workload's activation query.", 0),
                ("dprobe_scaler_active", "1 while the workload's activation query is above its threshold "
                                         "(KEDA's scaler active), else 0.", 1)):
            fam = GaugeMetricFamily(name, doc, labels=WORKLOAD_LABELS)
            for (ns, workload), row in sorted(activations.items()):
                fam.add_metric([ns, workload], float(row[pick]))
            yield fam
        per_vc = [
            (RECOMMENDED_GPUS, "GPUs recommended for the virtual cluster.", lambda d: d.replicas),
            ("dprobe_scaler_vc_demand_gpus", "Forecast GPU demand of the virtual cluster: its pods' predicted "
                                             "utilisation times their GPUs, summed, plus the GPUs waiting.",
             lambda d: d.demand),
            ("dprobe_scaler_vc_missing_gpus", "GPUs held by the virtual cluster's pods without a usable forecast.",
             lambda d: d.missing),
        ]
        for name, doc, value in per_vc:
            fam = GaugeMetricFamily(name, doc, labels=["vc"])
            for vc, d in sorted(vcs.items()):
                if not d.published:
                    continue
                v = value(d)
                if v is not None:
                    fam.add_metric([vc], float(v))
            yield fam
        held = GaugeMetricFamily("dprobe_scaler_vc_held_gpus", "GPUs the virtual cluster's pods hold.", labels=["vc"])
        for vc, n in sorted(dict(s.vc_held_gpus).items()):
            held.add_metric([vc], n)
        yield held
        pending = GaugeMetricFamily("dprobe_scaler_vc_pending_gpus", "GPUs waiting in the virtual cluster "
                                    "(vc_pending_query), counted in its demand.", labels=["vc"])
        for vc, n in sorted(dict(s.vc_pending_gpus).items()):
            pending.add_metric([vc], n)
        yield pending
        events = CounterMetricFamily("dprobe_scaler_scale_events", "Decisions that changed a workload's "
                                     "replicas, by direction.", labels=[*WORKLOAD_LABELS, "direction"])
        for key, n in sorted(s.events_total.items()):
            events.add_metric(list(key), n)
        yield events
        quota_events = CounterMetricFamily("dprobe_scaler_vc_scale_events", "Decisions that changed a virtual "
                                           "cluster's GPUs, by direction.", labels=["vc", "direction"])
        for key, n in sorted(s.vc_events_total.items()):
            quota_events.add_metric(list(key), n)
        yield quota_events
        errors = CounterMetricFamily("dprobe_scaler_errors", "Failed cycle stages: query (Prometheus), "
                                     "no_data (an answer without a usable forecast while pods expected some), "
                                     "kubernetes (reading or setting a scale or quota), events (recording an "
                                     "Event), cycle.", labels=["stage"])
        for stage, n in sorted(s.errors_total.items()):
            errors.add_metric([stage], n)
        yield errors
        rejected = CounterMetricFamily("dprobe_scaler_rejected_forecasts", "Forecasts left out as unusable "
                                       "(nan, infinite, negative, above_one): their pods count as missing.",
                                       labels=["reason"])
        for reason, n in sorted(dict(s.rejected_total).items()):
            rejected.add_metric([reason], n)
        yield rejected
        if s.last_cycle_at is not None:
            yield GaugeMetricFamily("dprobe_scaler_last_cycle_timestamp_seconds",
                                    "Unix time of the last decision cycle.", value=s.last_cycle_at)
