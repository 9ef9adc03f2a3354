"""Sidecar settings from defaults, a YAML file, ``DPROBE_SIDECAR_*`` variables and flags (in that order)."""

from __future__ import annotations

import argparse
import math
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dprobe.core.options import OptionSet, option
from dprobe.forecaster.baselines import BASELINES
from dprobe.forecaster.loading import SHIPPED
from dprobe.services.sources.prometheus import PrometheusAccess
from dprobe.services.sources.registry import source_names

ENV_PREFIX = "DPROBE_SIDECAR_"
SOURCES = source_names()
MODELS = (SHIPPED, *BASELINES)


@dataclass
class SidecarConfig(PrometheusAccess):
    """Every option of ``dprobe sidecar``; YAML keys may also be nested (``dcgm: {url: ...}``). The
    ``prometheus_*`` credential and TLS options (:class:`PrometheusAccess`) are the scaler's too."""

    listen_address: str = option("0.0.0.0", "address the HTTP server binds")
    port: int = option(9477, "port of /metrics, /healthz and /readyz")
    source: str = option("auto", "metric source; auto = nvml when a GPU is found, else replay", choices=SOURCES)
    sample_interval: float = option(1.0, "seconds between samples")
    forecast_interval: float = option(10.0, "seconds between forecast cycles (all targets in one batch)")
    step_seconds: float = option(10.0, "grid step of the forecast windows: samples are averaged per step")
    window_seconds: float = option(0.0, "history kept per target; 0 = what the forecaster reads (a checkpoint's "
                                      "context at its step, about 2 h for the bundled model; 1 h for a baseline)")
    horizons: list[int] = option([60, 300, 900], "forecast horizons in seconds (a small fixed set)")
    min_points: int = option(3, "steps of history a target needs before it is forecast")
    stale_after: float = option(30.0, "a target whose last sample is older than this is stale: no forecast shown")
    drop_after: float = option(300.0, "a target without samples for this long is forgotten")
    max_targets: int = option(5000, "at most this many targets are tracked (bounds memory)")
    checkpoint: str | None = option(None, "your trained forecaster (dprobe.onnx or dprobe.pt of python train.py); "
                                          "unset: --model")
    model: str = option("dprobe", "forecaster used without --checkpoint: dprobe (the one shipped with dprobe, "
                                  f"trained on the bundled traces) or a baseline ({', '.join(BASELINES)})",
                        choices=MODELS)
    fallback_on_bad_checkpoint: bool = option(False, "start with --model when the checkpoint cannot be used")
    http_timeout: float = option(3.0, "timeout of requests to dcgm-exporter / Prometheus (s)")
    max_backoff: float = option(60.0, "longest delay between retries of a failing source (s)")
    max_clock_skew: float = option(5.0, "samples stamped more than this many seconds ahead of the sidecar's clock "
                                        "are refused (counted in dprobe_rejected_samples_total)")
    dcgm_url: str = option("http://127.0.0.1:9400/metrics", "dcgm-exporter endpoint")
    dcgm_targets: str = option("pod", "dcgm targets: pod (GPU when unassigned), gpu or both",
                             choices=("pod", "gpu", "both"))
    dcgm_utilization: str = option("gpu_util", "utilisation field: gpu_util or gr_engine_active",
                                 choices=("gpu_util", "gr_engine_active"))
    prometheus_url: str = option("http://127.0.0.1:9090", "Prometheus server to read from")
    prometheus_memory_query: str = option("", "PromQL for memory bytes per target (default: from DCGM_FI_DEV_FB_USED)")
    prometheus_utilization_query: str = option("", "PromQL for utilisation 0-1 per target (default: DCGM_FI_DEV_GPU_UTIL)")
    prometheus_target_label: str = option("", "label naming the target (default: namespace/pod, else UUID)")
    nvml_per_process: bool = option(True, "also report per-pod memory from NVML processes (needs the pods' PIDs)")
    pod_name: str = option("", "namespace/pod of the pod this sidecar runs in (downward API), for NVML")
    replay_dataset: str = option("alibaba", "trace replayed: alibaba or h200", choices=("alibaba", "h200"))
    replay_path: str = option("", "directory laid out like the data set (default: the bundled copy)")
    replay_speed: float = option(0.0, "trace seconds per second (0 = the data set's default: 60 alibaba, 1 h200)")
    replay_loop: bool = option(True, "start the trace again at its end")
    replay_max_targets: int = option(0, "replay only the first N targets (0 = all)")
    synthetic_targets: int = option(64, "targets of the synthetic source")
    graph_file: str = option("", "model graph JSON (dprobe graph) for targets without a graphs entry")
    graphs: dict[str, str] = option({}, "target glob -> graph JSON path or model spec (YAML only, or JSON in env)")
    annotations_file: str = option("", "downward-API annotations file; dprobe.io/model-graph names the graph, "
                                       "dprobe.io/training-job the job (followed when they change)")
    graph_dir: str = option("", "directory of the graph files the pod annotations may name (no file outside it, "
                                "through .. or a symlink); unset: annotations name torchvision:, timm: and "
                                "transformers: models only")
    allow_code_annotations: bool = option(False, "let the pod annotations name module:pkg.mod:factory models and "
                                                 "config_kwargs, code the sidecar runs: only where whoever may "
                                                 "annotate the pods may run code in the sidecar")
    graph_max_mib: float = option(16.0, "largest graph JSON file read, in MiB (a larger one is not read: counted "
                                        "in dprobe_graph_errors_total{reason=\"too_large\"})")
    job_timeout: float = option(120.0, "seconds a job's cold-start prediction, or a model graph's build, may take "
                                       "(in a child process, killed past it)")
    job_cpu_limit: float = option(120.0, "CPU seconds of that child (RLIMIT_CPU)")
    job_memory_limit: float = option(8.0, "GiB of address space of that child (RLIMIT_AS; PyTorch's CUDA build "
                                          "maps about 3 GiB when imported)")
    job: str = option("", "training job of the targets without a jobs entry, as 'MODEL batch=N [precision=P] "
                          "[optimizer=O] [image=N] [seq=N] [gpu=NAME]': its cold-start profile is exported "
                          "(dprobe_job_*)")
    jobs: dict[str, str] = option({}, "target glob -> training job, as job (YAML only, or JSON in env)")
    coldstart_checkpoint: str | None = option(None, "cold-start checkpoint for the job profiles "
                                                    "(default: the one shipped with dprobe)")
    log_level: str = option("info", "debug, info, warning or error")

    def validate(self) -> SidecarConfig:
        for name in ("sample_interval", "forecast_interval", "step_seconds", "stale_after",
                     "drop_after", "http_timeout", "max_backoff", "job_timeout", "job_cpu_limit", "job_memory_limit",
                     "graph_max_mib"):
            if not 0 < getattr(self, name) < math.inf:  # NaN and inf too: a NaN stale_after hides everything
                raise ValueError(f"{name} must be positive (and finite), got {getattr(self, name)}")
        if not 0 <= self.max_clock_skew < math.inf:
            raise ValueError(f"max_clock_skew must be 0 or positive seconds, got {self.max_clock_skew}")
        if not 0 <= self.replay_speed < math.inf:
            raise ValueError(f"replay_speed must be positive, or 0 for the data set's default, got {self.replay_speed}")
        if not self.horizons or any(h < self.step_seconds for h in self.horizons):
            # below one step a horizon would be forecast a whole step ahead under its own label
            raise ValueError(f"horizons must be at least step_seconds ({self.step_seconds:g} s), got {self.horizons}")
        for name, least in (("max_targets", 1), ("min_points", 1), ("replay_max_targets", 0),
                            ("synthetic_targets", 1 if self.source == "synthetic" else 0)):
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be at least {least}, got {getattr(self, name)}")
        if self.stale_after < self.sample_interval:
            raise ValueError(f"stale_after ({self.stale_after:g} s) must not be shorter than sample_interval "
                             f"({self.sample_interval:g} s): every target would be stale between two samples")
        if self.max_backoff < self.sample_interval:
            raise ValueError(f"max_backoff ({self.max_backoff:g} s) must not be shorter than sample_interval "
                             f"({self.sample_interval:g} s)")
        if not 0 <= self.window_seconds < math.inf:
            raise ValueError(f"window_seconds must be positive, or 0 for the forecaster's own, got {self.window_seconds}")
        if self.window_seconds and self.window_seconds < 2 * self.step_seconds:
            raise ValueError("window_seconds must span at least two steps")
        if self.drop_after < self.stale_after:
            raise ValueError("drop_after must not be shorter than stale_after")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535 (0: any free port), got {self.port}")
        for source, name, example in (("dcgm", "dcgm_url", "http://HOST:9400/metrics"),
                                      ("prometheus", "prometheus_url", "http://HOST:9090")):
            url = urllib.parse.urlsplit(getattr(self, name))
            if self.source == source and (url.scheme not in ("http", "https") or not url.hostname):
                # a typo here would otherwise only show as a source failing for ever, retried with backoff
                raise ValueError(f"{name} must be an http(s) URL such as {example}, got {getattr(self, name)!r}")
        if self.source == "prometheus":
            self.check_prometheus_access(self.prometheus_url)
        self.horizons = sorted({int(h) for h in self.horizons})
        if self.job or self.jobs:  # a bad job stops the start (it would only ever be logged later)
            from dprobe.services.sidecar.jobs import JobSpec

            for where, text in [("job", self.job), *((f"jobs[{k!r}]", v) for k, v in self.jobs.items())]:
                if text:
                    try:
                        JobSpec.parse(text)
                    except ValueError as exc:
                        raise ValueError(f"{where}: {exc}") from exc
        return self

    @property
    def window_length(self) -> int:
        """Steps of history kept per target (``window_seconds`` must have been resolved: not 0)."""
        if not self.window_seconds:
            raise ValueError("window_seconds is 0 (the forecaster's own) until the sidecar resolves it")
        return max(2, int(round(self.window_seconds / self.step_seconds)))


# --help's sections (an option in none: "general")
GROUPS = {
    "forecasts": ("forecast_interval", "step_seconds", "window_seconds", "horizons", "min_points", "stale_after",
                  "drop_after", "max_targets", "checkpoint", "model", "fallback_on_bad_checkpoint"),
    "sources": ("source", "sample_interval", "http_timeout", "max_backoff", "max_clock_skew", "dcgm_",
                "prometheus_", "nvml_", "pod_name", "replay_", "synthetic_targets"),
    "model graphs and job profiles": ("graph_file", "graphs", "annotations_file", "graph_dir",
                                      "allow_code_annotations", "graph_max_mib", "job_", "job", "jobs",
                                      "coldstart_checkpoint"),
}
OPTIONS = OptionSet(SidecarConfig, ENV_PREFIX, "sidecar", GROUPS)
FIELDS = OPTIONS.fields
add_arguments = OPTIONS.add_arguments


def load_config(args: argparse.Namespace | Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None) -> SidecarConfig:
    """Merge defaults < YAML file < environment < flags into a validated :class:`SidecarConfig`."""
    return OPTIONS.load(args, env)
