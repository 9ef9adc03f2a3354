"""dcgm-exporter as a source: fetch its /metrics and parse the Prometheus text format."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from dprobe.core.options import option
from dprobe.services.sources.base import IDENTITY_LABELS, Sample, SourceError, check_reading, target_name
from dprobe.services.sources.http import http_get, redact_url
from dprobe.services.sources.registry import SourceContext, register

MIB = 1024 * 1024
FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": ("utilization", 0.01),  # percent -> ratio
    "DCGM_FI_DEV_FB_USED": ("memory", float(MIB)),  # MiB -> bytes
    "DCGM_FI_DEV_FB_FREE": ("free", float(MIB)),
    "DCGM_FI_DEV_POWER_USAGE": ("power", 1.0),  # W
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_active", 1.0),  # ratio
}
TARGET_MODES = ("pod", "gpu", "both")
UTILIZATION_FIELDS = ("gpu_util", "gr_engine_active")
RATIO_FIELDS = ("utilization", "gr_active")  # read as ratios: above 1 (100 %) is impossible


@dataclass
class DcgmOptions:
    """The options of the ``dcgm`` source (``dcgm_*``; YAML ``dcgm: {url: ...}``)."""

    url: str = option("http://127.0.0.1:9400/metrics", "dcgm-exporter endpoint")
    targets: str = option("pod", "dcgm targets: pod (GPU when unassigned), gpu or both", choices=TARGET_MODES)
    utilization: str = option("gpu_util", "utilisation field: gpu_util or gr_engine_active",
                              choices=UTILIZATION_FIELDS)


def _every(readings: list[dict[str, float | None]], field: str) -> list[float] | None:
    """``field`` of every GPU's readings, or None when one of them lacks it (absent or refused)."""
    got = [r.get(field) for r in readings]
    return [x for x in got if x is not None] if all(x is not None for x in got) else None


def parse_dcgm_text(text: str, ts: float, targets: str = "pod", utilization: str = "gpu_util") -> list[Sample]:
    """Samples from dcgm-exporter text: one per GPU, or per pod (summed memory, mean utilisation).

    ``targets``: ``pod`` (pods where the GPU is assigned to one, the GPU otherwise),
    ``gpu`` (GPUs only) or ``both``. A NaN, infinite, negative or above-100 % reading is refused
    (:func:`check_reading`, the reason kept in the sample's ``rejected``), and a pod's memory or
    utilisation is missing (None) when one of its GPUs lacks it: never a partial sum, never 0.
    Raises SourceError when the text does not parse or holds none of the DCGM fields.
    """
    per_gpu: dict[tuple, dict[str, float | None]] = defaultdict(dict)  # None: refused (reason in why)
    why: dict[tuple, dict[str, str]] = defaultdict(dict)
    ident: dict[tuple, dict[str, str]] = {}
    models: dict[tuple, str] = {}  # the GPU's modelName
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name not in FIELDS:
                    continue
                key_name, scale = FIELDS[s.name]
                labels = {k: s.labels.get(k, "") for k in IDENTITY_LABELS}
                key = tuple(labels[k] for k in IDENTITY_LABELS)
                ident[key] = labels
                if s.labels.get("modelName"):
                    models[key] = s.labels["modelName"]
                value, reason = check_reading(float(s.value) * scale, ratio=key_name in RATIO_FIELDS)
                per_gpu[key][key_name] = value
                if reason:
                    why[key][key_name] = reason
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise SourceError(f"not Prometheus text format: {exc}") from exc
    if not per_gpu:
        raise SourceError("no DCGM_FI_DEV_* metrics in the response")
    groups: dict[str, list[tuple]] = defaultdict(list)
    for key, labels in ident.items():
        pod_target = target_name(labels) if labels["pod"] else None
        gpu_target = target_name({**labels, "pod": ""})
        if targets in ("pod", "both") and pod_target:
            groups[pod_target].append(key)
        if (targets in ("gpu", "both") or (targets == "pod" and not pod_target)) and gpu_target:
            groups[gpu_target].append(key)
    out = []
    for target, keys in groups.items():
        vals = [per_gpu[k] for k in keys]
        util_key = "gr_active" if utilization == "gr_engine_active" else "utilization"
        if util_key == "gr_active" and not any("gr_active" in v for v in vals):  # not exported: GPU_UTIL
            util_key = "utilization"
        mems, utils = _every(vals, "memory"), _every(vals, util_key)
        extra: dict[str, float] = {"gpus": float(len(keys))}
        free = _every(vals, "free")
        if mems is not None and free is not None:
            extra["memory_total_bytes"] = sum(mems) + sum(free)
        powers = _every(vals, "power")
        if powers is not None:
            extra["power_watts"] = sum(powers)
        gr = _every(vals, "gr_active")
        if gr is not None:
            extra["gr_engine_active_ratio"] = sum(gr) / len(gr)
        labels = dict(ident[keys[0]])
        if len(keys) > 1:
            labels["gpu"] = ",".join(sorted({ident[k]["gpu"] for k in keys}))
            labels["UUID"] = ",".join(sorted({ident[k]["UUID"] for k in keys}))
        out.append(Sample(
            target=target, ts=ts,
            memory_bytes=sum(mems) if mems is not None else None,
            utilization_ratio=sum(utils) / len(utils) if utils is not None else None,
            labels=labels, extra=extra, gpu_model=next((models[k] for k in sorted(keys) if k in models), ""),
            rejected=tuple(why[k][f] for k in keys for f in ("memory", util_key) if f in why[k]),
        ))
    return out


class DcgmSource:
    """Polls a dcgm-exporter endpoint (``http://HOST:9400/metrics``)."""

    name = "dcgm"

    def __init__(self, url: str, timeout: float = 3.0, targets: str = "pod", utilization: str = "gpu_util"):
        if targets not in TARGET_MODES:
            raise ValueError(f"dcgm targets must be one of {TARGET_MODES}, got {targets!r}")
        if utilization not in UTILIZATION_FIELDS:
            raise ValueError(f"dcgm utilization must be one of {UTILIZATION_FIELDS}, got {utilization!r}")
        self.url, self.timeout, self.targets, self.utilization = url, timeout, targets, utilization

    def poll(self) -> list[Sample]:
        text = http_get(self.url, self.timeout)
        try:
            return parse_dcgm_text(text, time.time(), self.targets, self.utilization)
        except SourceError as exc:
            raise SourceError(f"{redact_url(self.url)}: {exc}") from exc

    def close(self) -> None:
        pass


    @classmethod
    def from_options(cls, options: DcgmOptions, context: SourceContext) -> DcgmSource:
        return cls(options.url, context.http_timeout, options.targets, options.utilization)


register("dcgm", DcgmSource.from_options)
