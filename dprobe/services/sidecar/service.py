"""The sidecar process: sources -> windows -> forecasts -> /metrics, with clean shutdown on SIGTERM."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
from prometheus_client import Histogram
from prometheus_client.registry import CollectorRegistry

from dprobe.core.names import FORECAST_SECONDS, SIDECAR_METRICS
from dprobe.core.options import comma_list
from dprobe.forecaster.base import Forecaster, ForecastInput
from dprobe.forecaster.loading import LoadedModel, open_forecaster, serves
from dprobe.services.exporter.server import ExporterServer, run_until_signalled
from dprobe.services.sidecar.annotations import AnnotationPolicy
from dprobe.services.sidecar.child import ChildRunner
from dprobe.services.sidecar.collector import SidecarCollector
from dprobe.services.sidecar.config import ForecastOptions, SidecarConfig
from dprobe.services.sidecar.engine import ForecastEngine
from dprobe.services.sidecar.graphs import GraphResolver
from dprobe.services.sidecar.jobs import JobLimits, JobProfiles
from dprobe.services.sidecar.memory import MemoryLimit
from dprobe.services.sidecar.poller import SourcePoller
from dprobe.services.sidecar.state import ForecastSnapshot, JobRow, Latest, SourceStatus
from dprobe.services.sidecar.window import WindowStore
from dprobe.services.sources.base import Sample, Source
from dprobe.services.sources.registry import SourceContext, build_source

log = logging.getLogger(__name__)
BASELINE_WINDOW_SECONDS = 3600.0  # history kept for a baseline forecaster (window_seconds: 0)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def forecaster_window_seconds(forecaster: Forecaster) -> float | None:
    """Seconds of history the forecaster reads for the sidecar's metrics (the longest of them), or None
    when it does not say (baselines)."""
    reads = getattr(forecaster, "window_seconds", None)
    spans = [float(reads(m)) for m in SIDECAR_METRICS if serves(forecaster, m)] if reads is not None else []
    return max(spans) if spans else None


def resolve_window(config: ForecastOptions, forecaster: Forecaster) -> float:
    """``window_seconds`` to use: the configured one (with a warning if shorter than the forecaster
    reads: the older part of its input would be gaps, and its forecasts worse), or with 0 what the
    forecaster reads (:data:`BASELINE_WINDOW_SECONDS` for a baseline)."""
    needed = forecaster_window_seconds(forecaster)
    if not config.window_seconds:
        window = max(needed or BASELINE_WINDOW_SECONDS, 2 * config.step_seconds)
        log.info("window: %g s of history per target (%s)", window,
                 "what the forecaster reads" if needed else "a baseline's default")
        return window
    if needed and config.window_seconds < 0.99 * needed:
        log.warning("window_seconds %g is shorter than the %g s the forecaster reads: the rest of its input is "
                    "gaps, and its forecasts are less accurate (set 0 to keep what it reads)",
                    config.window_seconds, needed)
    return config.window_seconds


def check_forecaster(engine: ForecastEngine, length: int, config: ForecastOptions) -> None:
    """Forecast one steady window of ``length`` steps with the engine's leads, as every cycle will: a
    horizon beyond the model's longest lead, or a step it cannot read, fails here (ValueError naming the
    options) rather than in every cycle after the start."""
    for metric in engine.metrics:
        level = 0.5 if metric == "gpu_utilization_ratio" else 2.0**33
        batch = ForecastInput(values=np.full((1, length), level), metric=metric, leads=engine.leads,
                              step_seconds=engine.store.step)
        try:
            engine.forecaster.predict(batch)
        except Exception as exc:
            horizons = ",".join(map(str, config.horizon_seconds))
            raise ValueError(f"the forecaster cannot serve horizons {horizons} at "
                             f"step_seconds {config.step_seconds:g}: {exc}") from exc


def reads_graphs(model: LoadedModel, step_seconds: float | None = None) -> bool:
    """Whether the forecaster reads model graphs: not a baseline, nor a trained network without workload
    conditioning (it forecasts every target as an unknown workload: its ``conditioned`` is False), nor one
    whose tasks that serve the sidecar's metrics at ``step_seconds`` never trained with a known workload
    (its ``workload_tasks``)."""
    forecaster = model.forecaster
    if model.kind.startswith("baseline:") or not getattr(forecaster, "conditioned", True):
        return False
    tasks = getattr(forecaster, "workload_tasks", None)
    task_for = getattr(forecaster, "task_for", None)  # a trained forecaster's (TrainedForecaster.task_for)
    if tasks is None or task_for is None or step_seconds is None:
        return True
    return any(tasks[task_for(m, step_seconds)[0]] for m in SIDECAR_METRICS if serves(forecaster, m))


def build_sources(config: SidecarConfig) -> list[Source]:
    """The configured source (:mod:`dprobe.services.sources.registry`), made from its option group; ``auto`` is
    NVML when it sees a GPU, else replay of a bundled trace."""
    fc = config.forecast
    return [build_source(config.sources.source, config.sources,
                         SourceContext(config.sources.http_timeout, fc.step_seconds, fc.window_seconds))]


class Sidecar:
    """Wires sources, windows, the forecast engine and the exporter; implements the exporter's state."""

    def __init__(self, config: SidecarConfig, sources: list[Source] | None = None,
                 model: LoadedModel | None = None):
        self.config = config.validate()
        fc, src, work = config.forecast, config.sources, config.workload
        self.model = model or open_forecaster(fc.checkpoint, fc.model, fc.fallback_on_bad_checkpoint,
                                              metrics=SIDECAR_METRICS)
        fc.window_seconds = resolve_window(fc, self.model.forecaster)
        if fc.min_points > fc.window_length:
            raise ValueError(f"min_points {fc.min_points} is more than the window holds "
                             f"({fc.window_length} steps of {fc.step_seconds:g} s): nothing would be forecast")
        self.sources = build_sources(config) if sources is None else sources
        self.memory = MemoryLimit.find(config.memory_limit_mib)
        log.info("memory: %s", self.memory)
        if not fc.max_targets:  # as many as the memory limit holds, beside what the sidecar takes now
            fc.max_targets, why = self.memory.max_targets(fc.window_length)
            log.info("max_targets: %d (%s)", fc.max_targets, why)
        self.store = WindowStore(fc.step_seconds, fc.window_length, fc.max_targets)
        self.registry = CollectorRegistry(auto_describe=False)
        self.forecast_seconds = Histogram(FORECAST_SECONDS, "Duration of a forecast cycle (all targets).",
                                          buckets=LATENCY_BUCKETS, registry=self.registry)
        self.annotation_policy = AnnotationPolicy(work.graph_dir, work.allow_code_annotations)
        # graphs and jobs are built in child processes within these limits, one child at a time
        self.children = ChildRunner(JobLimits(work.job_timeout, work.job_cpu_limit, work.job_memory_limit,
                                              work.job_rss_limit_mib), self.memory)
        self.graphs = GraphResolver(work.graphs, work.graph_file, work.annotations_file, self.annotation_policy,
                                    max_mib=work.graph_max_mib, runner=self.children,
                                    encoder=getattr(self.model.forecaster, "graph_encoder", None))
        self.jobs = JobProfiles(work.jobs, work.job, work.annotations_file, own_target=src.nvml.pod_name,
                                checkpoint=work.coldstart_checkpoint, policy=self.annotation_policy,
                                runner=self.children, gpu_specs=comma_list(work.gpu_spec_files))
        self.reads_graphs = reads_graphs(self.model, fc.step_seconds)
        if not self.reads_graphs and (self.graphs.active or self.graphs.annotations is not None):
            log.info("model graphs are not built: the forecaster (%s) does not read them", self.model.kind)
        self.engine = ForecastEngine(self.store, self.model.forecaster, fc.horizon_seconds, fc.stale_after,
                                     fc.drop_after, fc.min_points, self.graphs if self.reads_graphs else None,
                                     observe_seconds=self.forecast_seconds.observe)
        check_forecaster(self.engine, self.store.length, fc)
        self.stop_event = threading.Event()
        self.pollers = [SourcePoller(s, self._sink, src.sample_interval, src.max_backoff, self.stop_event,
                                     max_skew=src.max_clock_skew) for s in self.sources]
        self.collector = SidecarCollector(self)
        self.registry.register(self.collector)
        self.registry.register(self.annotation_policy)  # dprobe_annotations_refused_total
        self.registry.register(self.jobs)  # dprobe_job_profile_errors_total
        self.registry.register(self.graphs)  # dprobe_graph_errors_total
        self.registry.register(self.store)  # dprobe_targets_shed_total
        self.engine.on_publish = self.collector.prepare
        self.stale_after = fc.stale_after
        self.forecast_max_age = max(fc.stale_after, 3 * fc.forecast_interval)
        self.first_sample_at: float | None = None
        self.server: ExporterServer | None = None
        self._threads: list[threading.Thread] = []
        self._annotation_error = ""  # the last failure to follow the annotations, logged once

    # exporter state -------------------------------------------------------------------------------
    def forecast_snapshot(self) -> ForecastSnapshot | None:
        return self.engine.snapshot

    def latest_samples(self) -> dict[str, Latest]:
        return self.store.snapshot_latest()

    def source_status(self) -> list[SourceStatus]:
        return [SourceStatus(p.source.name, p.up, p.errors_total, dict(p.rejected)) for p in self.pollers]

    def forecast_errors(self) -> int:
        return self.engine.errors_total

    def model_labels(self) -> dict[str, str]:
        return {"version": self.model.version, "checkpoint": self.model.checkpoint, "kind": self.model.kind}

    def job_rows(self, latest: dict[str, Latest], fresh: set[str]) -> list[JobRow]:
        """The cold-start profiles of the fresh targets' jobs (and of this sidecar's own pod's, from the start)."""
        if not self.jobs.active:
            return []
        rows = []
        gpu_models = {t: latest[t].gpu_model for t in fresh if t in latest and latest[t].gpu_model}
        for target, profile in self.jobs.profiles(sorted(fresh), gpu_models).items():
            if target in latest:
                labels = latest[target].labels
            else:  # the own pod, before its first sample
                ns, _, pod = target.rpartition("/")
                labels = {"namespace": ns, "pod": pod}
            rows.append(JobRow(target, labels, profile.values, profile.info))
        return rows

    def ready(self) -> tuple[bool, str]:
        """Ready while its forecasts are current: the model is loaded, a first sample came and a source's
        last poll succeeded. It says so for the sidecar's own monitoring: no manifest of dprobe's puts it
        on a workload's pod, whose serving must not hang on a metrics source."""
        failing = "; ".join(f"source {p.source.name} failing: {p.last_error}" for p in self.pollers
                            if not p.up and p.last_error)
        if self.first_sample_at is None:  # the source's last error, where it failed (a 401, say), says why
            return False, "no sample yet" + (f": {failing}" if failing else "")
        if self.pollers and not any(p.up for p in self.pollers):
            return False, failing
        return True, f"model {self.model.kind} loaded, {len(self.store.latest)} targets"

    # lifecycle ------------------------------------------------------------------------------------
    def _sink(self, samples: list[Sample], source: str) -> None:
        if samples and self.first_sample_at is None:
            self.first_sample_at = time.time()
            log.info("first sample from %s", source)
        self.store.add(samples, source)

    def refresh_annotations(self) -> None:
        """Follow the pod's ``dprobe.io/model-graph`` and ``dprobe.io/training-job`` annotations (``kubectl
        annotate`` reaches the downward-API file without a restart)."""
        self.graphs.refresh()
        if self.jobs.refresh():
            self.jobs.profiles([])  # the own pod's new job, before its next sample

    def _forecast_loop(self) -> None:
        interval = self.config.forecast.forecast_interval
        next_at = time.monotonic() + min(interval, 2 * self.config.sources.sample_interval)
        while not self.stop_event.wait(max(0.0, next_at - time.monotonic())):
            try:
                self.refresh_annotations()
            except Exception as exc:  # whatever the annotations say, the forecasts go on
                if str(exc) != self._annotation_error:
                    log.error("pod annotations not followed: %s: %s", type(exc).__name__, exc)
                self._annotation_error = str(exc)
            else:
                self._annotation_error = ""
            self.engine.cycle()  # counts and logs its own failures
            next_at = max(next_at + interval, time.monotonic() + 0.05 * interval)

    def start(self, serve: bool = True) -> None:
        if serve:
            self.server = ExporterServer(self.registry, self, **self.config.web.server_kwargs(),
                                         fast=lambda _reg: self.collector.render_text(
                                             [self.forecast_seconds, self.annotation_policy, self.jobs,
                                              self.graphs, self.store]))
            self.server.start()
            model = self.model.kind + (f" from {self.model.checkpoint}" if self.model.checkpoint else "")
            log.info("serving http://%s:%d/metrics (model %s, source %s)", self.config.web.listen_address,
                     self.server.port, model, ",".join(s.name for s in self.sources))
        for p in self.pollers:
            self._threads.append(p.start())
        t = threading.Thread(target=self._forecast_loop, name="forecast", daemon=True)
        t.start()
        self._threads.append(t)
        if self.reads_graphs:
            self._threads.append(self.graphs.start())  # builds graphs beside the forecasts, never in their way
        if self.jobs.active or self.jobs.annotations is not None:  # an annotation may name a job later
            self.jobs.profiles([])  # the own pod's job, before its first sample
            self.jobs.start()

    def stop(self, timeout: float = 3.0) -> None:
        """Stop sampling and forecasting, then the server; bounded by ``timeout`` seconds in all."""
        self.stop_event.set()
        self.jobs.stop()
        self.graphs.stop()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if self.server is not None:
            self.server.stop(max(0.1, deadline - time.monotonic()))
        for s in self.sources:
            try:
                s.close()
            except Exception:  # closing is best effort at shutdown
                log.debug("closing %s failed", s.name, exc_info=True)

    def run(self) -> int:
        """Run until SIGTERM / SIGINT; returns the exit code."""
        return run_until_signalled(self.stop_event, self.start, self.stop)
