"""Sidecar settings from defaults, a YAML file, ``DPROBE_SIDECAR_*`` variables and flags (in that order; read
and type-checked with pydantic-settings, :mod:`dprobe.core.option_sources`).

The options come in groups (:mod:`dprobe.core.options`): the HTTP server's (:class:`WebOptions`), the
forecasts' (:class:`ForecastOptions`), the sources' (:class:`SourceOptions`, holding each source's own group,
declared beside the source: ``DcgmOptions`` in :mod:`dprobe.services.sources.dcgm`, ...) and the model graphs'
and job profiles' (:class:`WorkloadOptions`). Their flags, variables and YAML keys keep their flat names
(``--dcgm-url``, ``dcgm: {url: ...}``), and so does :class:`SidecarConfig` (``config.dcgm_url`` is
``config.sources.dcgm.url``).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dprobe.core.names import BASELINES
from dprobe.core.options import (
    OptionSet,
    at_least,
    check_options,
    group,
    http_url,
    non_negative,
    option,
    positive,
    settings,
    zero_means,
)
from dprobe.forecaster.loading import SHIPPED
from dprobe.services.exporter.options import WebOptions
from dprobe.services.sidecar.child import RSS_DERIVED
from dprobe.services.sidecar.memory import DEFAULT_MAX_TARGETS
from dprobe.services.sources.dcgm import DcgmOptions
from dprobe.services.sources.http import HttpAuth
from dprobe.services.sources.nvml import NvmlOptions
from dprobe.services.sources.prometheus import PrometheusOptions
from dprobe.services.sources.registry import SourceContext, source_names
from dprobe.services.sources.replay import ReplayOptions
from dprobe.services.sources.synthetic import SyntheticOptions

ENV_PREFIX = "DPROBE_SIDECAR_"
SOURCES = source_names()
MODELS = (SHIPPED, *BASELINES)


@dataclass
class ForecastOptions:
    """What is forecast, how often, from how much history, with which forecaster."""

    forecast_interval: float = option(10.0, "seconds between forecast cycles (all targets in one batch)",
                                      check=positive)
    step_seconds: float = option(10.0, "grid step of the forecast windows: samples are averaged per step",
                                 check=positive)
    window_seconds: float = option(0.0, "history kept per target; 0 = what the forecaster reads (a checkpoint's "
                                        "context at its step, about 2 h for the bundled model; 1 h for a baseline)",
                                   check=zero_means("the forecaster's own"))
    horizon_seconds: list[int] = option([60, 300, 900], "forecast horizons in seconds (a small fixed set; the "
                                                        "horizon_seconds label of the forecasts)",
                                        aliases=("horizons",))
    min_points: int = option(3, "steps of history a target needs before it is forecast", check=at_least(1))
    stale_after: float = option(30.0, "a target whose last sample is older than this is stale: no forecast shown",
                                check=positive)  # NaN too: a NaN stale_after hides everything
    drop_after: float = option(300.0, "a target without samples for this long is forgotten", check=positive)
    max_targets: int = option(0, "at most this many targets are tracked (bounds memory): past it the least recently "
                                 "sampled is shed (dprobe_targets_shed_total); 0 = as many as the memory limit "
                                 f"holds, at most {DEFAULT_MAX_TARGETS} ({DEFAULT_MAX_TARGETS} without a limit)",
                              check=zero_means("as many as the memory limit holds"))
    checkpoint: str | None = option(None, "your trained forecaster (dprobe.onnx or dprobe.pt of python train.py); "
                                          "unset: --model")
    model: str = option("dprobe", "forecaster used without --checkpoint: dprobe (the one shipped with dprobe, "
                                  f"trained on the bundled traces) or a baseline ({', '.join(BASELINES)})",
                        choices=MODELS)
    fallback_on_bad_checkpoint: bool = option(False, "start with --model when the checkpoint cannot be used")

    @property
    def window_length(self) -> int:
        """Steps of history kept per target (``window_seconds`` must have been resolved: not 0)."""
        if not self.window_seconds:
            raise ValueError("window_seconds is 0 (the forecaster's own) until the sidecar resolves it")
        return max(2, int(round(self.window_seconds / self.step_seconds)))


@dataclass
class SourceOptions:
    """Where the samples come from and how often they are read; each source's own options in its group, under
    its name (:func:`~dprobe.services.sources.registry.build_source` finds them there)."""

    source: str = option("auto", "metric source; auto = nvml when a GPU is found, else replay", choices=SOURCES)
    sample_interval: float = option(1.0, "seconds between samples", check=positive)
    http_timeout: float = option(3.0, "timeout of requests to dcgm-exporter / Prometheus (s)", check=positive)
    max_backoff: float = option(60.0, "longest delay between retries of a failing source (s)", check=positive)
    max_clock_skew: float = option(5.0, "samples stamped more than this many seconds ahead of the sidecar's clock "
                                        "are refused (counted in dprobe_rejected_samples_total)", check=non_negative)
    dcgm: DcgmOptions = group(DcgmOptions)
    prometheus: PrometheusOptions = group(PrometheusOptions)
    nvml: NvmlOptions = group(NvmlOptions)
    replay: ReplayOptions = group(ReplayOptions)
    synthetic: SyntheticOptions = group(SyntheticOptions)


@dataclass
class WorkloadOptions:
    """What the targets run: their model graphs and training jobs, read in child processes within limits."""

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
                                        "in dprobe_graph_errors_total{reason=\"too_large\"})", check=positive)
    job_timeout: float = option(120.0, "seconds a job's cold-start prediction, or a model graph's build, may take "
                                       "(in a child process, killed past it)", check=positive)
    job_cpu_limit: float = option(120.0, "CPU seconds of that child (RLIMIT_CPU)", check=positive)
    job_memory_limit: float = option(8.0, "GiB of address space of that child (RLIMIT_AS; PyTorch's CUDA build "
                                          "maps about 3 GiB when imported)", check=positive)
    job_rss_limit_mib: float = option(0.0, "MiB of resident memory of that child (read every 50 ms, killed past "
                                           "it); 0 = what the memory limit leaves: the limit less the sidecar's "
                                           "own resident memory and a 64 MiB margin (unwatched without a limit)",
                                      check=zero_means(RSS_DERIVED))
    job: str = option("", "training job of the targets without a jobs entry, as 'MODEL batch=N [precision=P] "
                          "[optimizer=O] [image=N] [seq=N] [gpu=NAME]': its cold-start profile is exported "
                          "(dprobe_job_*)")
    jobs: dict[str, str] = option({}, "target glob -> training job, as job (YAML only, or JSON in env)")
    coldstart_checkpoint: str | None = option(None, "cold-start checkpoint for the job profiles "
                                                    "(default: the one shipped with dprobe)")
    gpu_spec_files: str = option("", "GPU spec files (dprobe gpu calibrate's, or spec sheets as dprobe predict "
                                     "--gpu-spec reads them) or directories of them, comma-separated: GPUs the "
                                     "jobs may name (gpu=NAME) and the node's GPU is matched against by name")


@settings
class SidecarConfig:
    """Every option of ``dprobe sidecar``, in its groups; also by flat name (``SidecarConfig(dcgm_url=...)``,
    ``config.dcgm_url``). YAML keys may be nested (``dcgm: {url: ...}``). The ``prometheus_*`` credential and
    TLS options (:class:`~dprobe.services.sources.prometheus.PrometheusAccess`) are the scaler's too."""

    web: WebOptions = group(WebOptions, prefix="web_")
    forecast: ForecastOptions = group(ForecastOptions, "forecasts", prefix="")
    sources: SourceOptions = group(SourceOptions, "sources", prefix="")
    workload: WorkloadOptions = group(WorkloadOptions, "model graphs and job profiles", prefix="")
    memory_limit_mib: float = option(0.0, "MiB of memory the sidecar and its child processes may use, from which "
                                          "max_targets and job_rss_limit_mib are derived; 0 = the container's "
                                          "memory limit (cgroup memory.max or memory.limit_in_bytes)",
                                     check=zero_means("the container's memory limit"))
    log_level: str = option("info", "debug, info, warning or error")

    def validate(self) -> SidecarConfig:
        """Check every option (:func:`~dprobe.core.options.check_options`), then the options together; a
        ValueError naming the option(s)."""
        check_options(self)
        fc, src = self.forecast, self.sources
        self.web.check()
        if not fc.horizon_seconds or any(h < fc.step_seconds for h in fc.horizon_seconds):
            # below one step a horizon would be forecast a whole step ahead under its own label
            raise ValueError(f"horizon_seconds must be at least step_seconds ({fc.step_seconds:g} s), "
                             f"got {fc.horizon_seconds}")
        if src.source == "synthetic":
            at_least(1)("synthetic_targets", src.synthetic.targets)
        if fc.stale_after < src.sample_interval:
            raise ValueError(f"stale_after ({fc.stale_after:g} s) must not be shorter than sample_interval "
                             f"({src.sample_interval:g} s): every target would be stale between two samples")
        if src.max_backoff < src.sample_interval:
            raise ValueError(f"max_backoff ({src.max_backoff:g} s) must not be shorter than sample_interval "
                             f"({src.sample_interval:g} s)")
        if fc.window_seconds and fc.window_seconds < 2 * fc.step_seconds:
            raise ValueError("window_seconds must span at least two steps")
        if fc.drop_after < fc.stale_after:
            raise ValueError("drop_after must not be shorter than stale_after")
        # a typo in the URL of the source read would otherwise only show as a source failing for ever
        if src.source == "dcgm":
            http_url("http://HOST:9400/metrics")("dcgm_url", src.dcgm.url)
        if src.source == "prometheus":
            http_url("http://HOST:9090")("prometheus_url", src.prometheus.url)
            src.prometheus.check_access(src.prometheus.url)
        fc.horizon_seconds = sorted({int(h) for h in fc.horizon_seconds})
        if self.workload.job or self.workload.jobs or self.workload.gpu_spec_files:
            # a bad job or spec file stops the start (it would only ever be logged later)
            from dprobe.core.gpu_registry import GPUSpecFiles
            from dprobe.core.options import comma_list
            from dprobe.services.sidecar.jobs import JobSpec

            gpus = GPUSpecFiles.load(comma_list(self.workload.gpu_spec_files))
            for where, text in [("job", self.workload.job),
                                *((f"jobs[{k!r}]", v) for k, v in self.workload.jobs.items())]:
                if text:
                    try:
                        JobSpec.parse(text, gpus)
                    except ValueError as exc:
                        raise ValueError(f"{where}: {exc}") from exc
        return self

    @property
    def window_length(self) -> int:
        """Steps of history kept per target (:attr:`ForecastOptions.window_length`)."""
        return self.forecast.window_length

    def prometheus_auth(self) -> HttpAuth:
        """The credentials and TLS settings of the ``prometheus`` source."""
        return self.sources.prometheus.auth()

    def source_context(self) -> SourceContext:
        """What every source is told beside its own options (the window resolved: not 0)."""
        return SourceContext(self.sources.http_timeout, self.forecast.step_seconds, self.forecast.window_seconds)


# the flags `dprobe sidecar --help` shows (every option's flag is taken: --help-all lists them)
MAIN_FLAGS = ("port", "listen_address", "log_level", "source", "dcgm_url", "prometheus_url", "pod_name",
              "sample_interval", "forecast_interval", "horizon_seconds", "checkpoint", "model", "job")
OPTIONS = OptionSet(SidecarConfig, ENV_PREFIX, "sidecar", flags=MAIN_FLAGS)
FIELDS = OPTIONS.fields
add_arguments = OPTIONS.add_arguments


def load_config(args: argparse.Namespace | Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None) -> SidecarConfig:
    """Merge defaults < YAML file < environment < flags into a validated :class:`SidecarConfig`."""
    return OPTIONS.load(args, env)
