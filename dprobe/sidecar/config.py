"""Sidecar settings from defaults, a YAML file, ``DPROBE_SIDECAR_*`` variables and flags (in that order)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ENV_PREFIX = "DPROBE_SIDECAR_"
SOURCES = ("auto", "nvml", "dcgm", "prometheus", "replay", "synthetic")


def _opt(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, list | dict):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class SidecarConfig:
    """Every option of ``dprobe sidecar``; YAML keys may also be nested (``dcgm: {url: ...}``)."""

    listen_address: str = _opt("0.0.0.0", "address the HTTP server binds")
    port: int = _opt(9477, "port of /metrics, /healthz and /readyz")
    source: str = _opt("auto", "metric source; auto = nvml when a GPU is found, else replay", choices=SOURCES)
    sample_interval: float = _opt(1.0, "seconds between samples")
    forecast_interval: float = _opt(10.0, "seconds between forecast cycles (all targets in one batch)")
    step_seconds: float = _opt(10.0, "grid step of the forecast windows: samples are averaged per step")
    window_seconds: float = _opt(0.0, "history kept per target; 0 = what the forecaster reads (a checkpoint's "
                                      "context at its step, about 2 h for the bundled model; 1 h for a baseline)")
    horizons: list[int] = _opt([60, 300, 900], "forecast horizons in seconds (a small fixed set)")
    min_points: int = _opt(3, "steps of history a target needs before it is forecast")
    stale_after: float = _opt(30.0, "a target whose last sample is older than this is stale: no forecast shown")
    drop_after: float = _opt(300.0, "a target without samples for this long is forgotten")
    max_targets: int = _opt(5000, "at most this many targets are tracked (bounds memory)")
    checkpoint: str | None = _opt(None, "trained model checkpoint; none = the baseline model")
    model: str = _opt("ewma", "baseline forecaster used without a checkpoint (ewma, last_value, moving_median, ...)")
    fallback_on_bad_checkpoint: bool = _opt(False, "start with the baseline when the checkpoint cannot be used")
    http_timeout: float = _opt(3.0, "timeout of requests to dcgm-exporter / Prometheus (s)")
    max_backoff: float = _opt(60.0, "longest delay between retries of a failing source (s)")
    dcgm_url: str = _opt("http://127.0.0.1:9400/metrics", "dcgm-exporter endpoint")
    dcgm_targets: str = _opt("pod", "dcgm targets: pod (GPU when unassigned), gpu or both",
                             choices=("pod", "gpu", "both"))
    dcgm_utilization: str = _opt("gpu_util", "utilisation field: gpu_util or gr_engine_active",
                                 choices=("gpu_util", "gr_engine_active"))
    prometheus_url: str = _opt("http://127.0.0.1:9090", "Prometheus server to read from")
    prometheus_memory_query: str = _opt("", "PromQL for memory bytes per target (default: from DCGM_FI_DEV_FB_USED)")
    prometheus_utilization_query: str = _opt("", "PromQL for utilisation 0-1 per target (default: DCGM_FI_DEV_GPU_UTIL)")
    prometheus_target_label: str = _opt("", "label naming the target (default: namespace/pod, else UUID)")
    nvml_per_process: bool = _opt(True, "also report per-pod memory from NVML processes (needs the pods' PIDs)")
    pod_name: str = _opt("", "namespace/pod of the pod this sidecar runs in (downward API), for NVML")
    replay_dataset: str = _opt("alibaba", "trace replayed: alibaba or h200", choices=("alibaba", "h200"))
    replay_path: str = _opt("", "directory laid out like the data set (default: the bundled copy)")
    replay_speed: float = _opt(0.0, "trace seconds per second (0 = the data set's default: 60 alibaba, 1 h200)")
    replay_loop: bool = _opt(True, "start the trace again at its end")
    replay_max_targets: int = _opt(0, "replay only the first N targets (0 = all)")
    synthetic_targets: int = _opt(64, "targets of the synthetic source")
    graph_file: str = _opt("", "model graph JSON (dprobe graph) for targets without a graphs entry")
    graphs: dict[str, str] = _opt({}, "target glob -> graph JSON path or model spec (YAML only, or JSON in env)")
    annotations_file: str = _opt("", "downward-API annotations file; dprobe.io/model-graph names the graph")
    log_level: str = _opt("info", "debug, info, warning or error")

    def validate(self) -> SidecarConfig:
        if not self.horizons or any(h <= 0 for h in self.horizons):
            raise ValueError(f"horizons must be positive seconds, got {self.horizons}")
        for name in ("sample_interval", "forecast_interval", "step_seconds", "stale_after",
                     "drop_after", "http_timeout", "max_backoff"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.window_seconds < 0:
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
        self.horizons = sorted({int(h) for h in self.horizons})
        return self

    @property
    def window_length(self) -> int:
        """Steps of history kept per target (``window_seconds`` must have been resolved: not 0)."""
        if not self.window_seconds:
            raise ValueError("window_seconds is 0 (the forecaster's own) until the sidecar resolves it")
        return max(2, int(round(self.window_seconds / self.step_seconds)))


FIELDS = {f.name: f for f in dataclasses.fields(SidecarConfig)}


def convert(name: str, value: Any, origin: str) -> Any:
    """``value`` (from YAML, env or a flag) as the type of option ``name``; clear error naming ``origin``."""
    f = FIELDS[name]
    typ = str(f.type)
    try:
        if typ.startswith("list"):
            items = value.split(",") if isinstance(value, str) else list(value)
            value = [int(float(v)) for v in items if str(v).strip()]
        elif typ.startswith("dict"):
            if isinstance(value, str):
                value = yaml.safe_load(value) or {}
            if not isinstance(value, Mapping):
                raise ValueError("expected a mapping")
            value = {str(k): str(v) for k, v in value.items()}
        elif typ == "bool":
            if isinstance(value, str):
                low = value.strip().lower()
                if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(f"expected true/false, got {value!r}")
                value = low in ("1", "true", "yes", "on")
            else:
                value = bool(value)
        elif typ == "int":
            value = int(value)
        elif typ == "float":
            value = float(value)
        elif typ.startswith("str | None"):
            value = None if value in (None, "") else str(value)
        else:
            value = "" if value is None else str(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{origin}: option {name}: {exc}") from exc
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        raise ValueError(f"{origin}: option {name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested YAML sections to flat option names (``dcgm: {url: X}`` -> ``dcgm_url``)."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        name = f"{prefix}{str(key).replace('-', '_')}"
        if isinstance(value, Mapping) and name not in FIELDS:
            out.update(flatten(value, f"{name}_"))
        else:
            out[name] = value
    return out


def from_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ValueError(f"{path}: cannot read config ({exc.strerror or exc})") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(doc, Mapping):
        raise ValueError(f"{path}: the config must be a mapping of options")
    doc = doc.get("sidecar", doc) if isinstance(doc.get("sidecar"), Mapping) else doc
    flat = flatten(doc)
    unknown = sorted(set(flat) - set(FIELDS))
    if unknown:
        raise ValueError(f"{path}: unknown option(s) {', '.join(unknown)}")
    return {k: convert(k, v, str(path)) for k, v in flat.items()}


def from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out = {}
    for name in FIELDS:
        key = ENV_PREFIX + name.upper()
        if key in env:
            out[name] = convert(name, env[key], key)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per option (``--dcgm-url``), plus ``--config``; defaults are applied later."""
    parser.add_argument("--config", metavar="FILE", default=None,
                        help=f"YAML config file (env {ENV_PREFIX}CONFIG)")
    defaults = SidecarConfig()
    for name, f in FIELDS.items():
        flag = "--" + name.replace("_", "-")
        env = ENV_PREFIX + name.upper()
        default = getattr(defaults, name)
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        help_text = f"{f.metadata['help']} (env {env}; default: {shown!r})".replace("%", "%%")
        kw: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if str(f.type) == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["metavar"] = name.split("_")[-1].upper()
            if f.metadata.get("choices"):
                kw["choices"] = f.metadata["choices"]
        parser.add_argument(flag, **kw)


def load_config(args: argparse.Namespace | Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None) -> SidecarConfig:
    """Merge defaults < YAML file < environment < flags into a validated :class:`SidecarConfig`."""
    env = os.environ if env is None else env
    given = dict(vars(args) if isinstance(args, argparse.Namespace) else (args or {}))
    config_file = given.pop("config", None) or env.get(ENV_PREFIX + "CONFIG")
    values: dict[str, Any] = {}
    if config_file:
        values.update(from_file(config_file))
    values.update(from_env(env))
    values.update({k: convert(k, v, "--" + k.replace("_", "-")) for k, v in given.items() if k in FIELDS})
    return SidecarConfig(**values).validate()
