"""NVML (nvidia-ml-py) as a source: per-GPU readings and per-process memory mapped to pods."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dprobe.core.options import option
from dprobe.services.sources.base import Sample, SourceError
from dprobe.services.sources.registry import SourceContext, register

log = logging.getLogger(__name__)

# kubepods cgroup paths, v1 (".../pod<uid>/<container>") and systemd ("...-pod<uid>.slice/cri-...-<id>.scope")
_POD_RE = re.compile(r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})")
_CONTAINER_RE = re.compile(r"([0-9a-f]{64})")


@dataclass
class NvmlOptions:
    """The options of the ``nvml`` source (``nvml_*``, and ``pod_name``)."""

    per_process: bool = option(True, "also report per-pod memory from NVML processes (needs the pods' PIDs)")
    pod_name: str = option("", "namespace/pod of the pod this sidecar runs in (downward API), for NVML",
                           name="pod_name")


def pod_of_cgroup(text: str) -> tuple[str, str] | None:
    """(pod UID, container id) from the contents of ``/proc/PID/cgroup``, or None outside Kubernetes."""
    m = _POD_RE.search(text)
    if not m:
        return None
    uid = m.group(1).replace("_", "-")
    c = _CONTAINER_RE.search(text[m.end():])
    return uid, c.group(1) if c else ""


def pod_of_pid(pid: int, proc: Path = Path("/proc")) -> tuple[str, str] | None:
    """The pod of a process, when its cgroup is visible from here (same PID namespace or hostPID)."""
    try:
        return pod_of_cgroup((proc / str(pid) / "cgroup").read_text())
    except OSError:
        return None


class NvmlSource:
    """Reads every GPU through NVML; with ``per_process`` also each pod's used memory.

    A pod is known by its UID from the process's cgroup; ``pod_names`` maps
    UIDs to ``namespace/pod`` (the sidecar's own pod comes from the downward
    API). Processes whose pod cannot be seen are counted on the GPU only; a pod
    with a process whose memory NVML does not report has no memory reading (not
    the sum of the others).
    """

    name = "nvml"

    def __init__(self, per_process: bool = True, pod_names: dict[str, str] | None = None,
                 pod_resolver: Callable[[int], tuple[str, str] | None] = pod_of_pid):
        import pynvml

        self._nvml = pynvml
        self.per_process = per_process
        self.pod_names = dict(pod_names or {})
        self.pod_resolver = pod_resolver
        self._initialised = False  # NVML is initialised on the first poll, and again after a failure

    def _init(self) -> None:
        try:
            self._nvml.nvmlInit()
            self._initialised = True
        except self._nvml.NVMLError as exc:
            raise SourceError(f"NVML init failed: {exc}") from exc

    def device_count(self) -> int:
        if not self._initialised:
            self._init()
        try:
            return int(self._nvml.nvmlDeviceGetCount())
        except self._nvml.NVMLError as exc:
            raise SourceError(f"NVML: {exc}") from exc

    def poll(self) -> list[Sample]:
        nv = self._nvml
        if not self._initialised:
            self._init()
        out: list[Sample] = []
        pods: dict[str, dict] = defaultdict(lambda: {"memory": 0.0, "known": True, "gpus": set(), "container": ""})
        try:
            now = time.time()
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = nv.nvmlDeviceGetUUID(h)
                uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                util = nv.nvmlDeviceGetUtilizationRates(h)
                extra = {"memory_total_bytes": float(mem.total)}
                try:
                    extra["power_watts"] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
                    extra["sm_clock_hertz"] = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) * 1e6
                except nv.NVMLError:  # not supported on every board: optional readings
                    pass
                out.append(Sample(target=uuid, ts=now, memory_bytes=float(mem.used),
                                  utilization_ratio=util.gpu / 100.0,
                                  labels={"gpu": str(i), "UUID": uuid}, extra=extra))
                if self.per_process:
                    for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                        pod = self.pod_resolver(int(p.pid))
                        if pod is None:
                            continue
                        used = getattr(p, "usedGpuMemory", None)  # None: NVML cannot say (e.g. WDDM, MIG)
                        entry = pods[pod[0]]
                        if used is None:
                            entry["known"] = False  # a sum without it would be too low: the pod's memory is missing
                        else:
                            entry["memory"] += float(used)
                        entry["gpus"].add((str(i), uuid))
                        entry["container"] = entry["container"] or pod[1]
        except nv.NVMLError as exc:
            self._shutdown()  # re-initialise on the next poll (driver reload, GPU reset)
            raise SourceError(f"NVML: {exc}") from exc
        for uid, entry in pods.items():
            name = self.pod_names.get(uid, f"pod-uid/{uid}")
            ns, _, pod_name = name.rpartition("/")
            gpus = sorted(entry["gpus"])
            out.append(Sample(target=name, ts=now, memory_bytes=entry["memory"] if entry["known"] else None,
                              labels={"pod": pod_name, "namespace": ns, "container": entry["container"],
                                      "gpu": ",".join(g for g, _ in gpus), "UUID": ",".join(u for _, u in gpus)}))
        return out

    def _shutdown(self) -> None:
        if self._initialised:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()
            self._initialised = False

    def close(self) -> None:
        self._shutdown()


def gpu_names() -> list[str]:
    """The names of the GPUs NVML sees ("NVIDIA H100 80GB HBM3", ...); empty without NVML or a GPU."""
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception:  # no library, no driver: no GPU to name
        return []
    try:
        names = [nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount())]
        return [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    except nv.NVMLError:
        return []
    finally:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()


def nvml_available() -> bool:
    """True when NVML loads and sees at least one GPU."""
    try:
        src = NvmlSource(per_process=False)
    except (SourceError, ImportError, OSError):
        return False
    try:
        return src.device_count() > 0
    except SourceError:
        return False
    finally:
        src.close()


def _from_options(options: NvmlOptions, context: SourceContext) -> NvmlSource:
    """NVML, with the sidecar's own pod named ``options.pod_name`` (its processes' cgroup is this one's)."""
    names = {}
    if options.pod_name:
        try:
            own = pod_of_cgroup(Path("/proc/self/cgroup").read_text())
        except OSError:
            own = None
        if own:
            names[own[0]] = options.pod_name
    return NvmlSource(per_process=options.per_process, pod_names=names, pod_resolver=pod_of_pid)


register("nvml", _from_options, available=nvml_available)
