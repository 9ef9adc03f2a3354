"""Cold-start profiles of the training jobs that targets run: what ``dprobe predict`` says of each job,
computed once per job, in a child process with CPU, memory and time limits, and exported beside the
forecasts.

A job is given as ``MODEL key=value ...`` (``torchvision:resnet50 batch=64 precision=bf16``): by a
``jobs`` entry (target glob -> job), the ``job`` option (every other target) or the pod annotation
``dprobe.io/training-job`` (read from the downward-API annotations file; it overrides ``job``, and may
name only what an :class:`~dprobe.services.sidecar.annotations.AnnotationPolicy` allows).
A job's GPU is a built-in one (``gpu=h100``) or one of the ``gpu_spec_files``
(:class:`~dprobe.core.gpu_registry.GPUSpecFiles`: spec sheets, or ``dprobe gpu calibrate``'s files), which are
also matched against the name of the GPU a job runs on; such a job is predicted with the file's spec, as
``dprobe predict --gpu-spec FILE`` predicts it.
The profile exists before the job's first sample, so it is what the sidecar knows of a job it has
no metrics for yet; it never changes the forecasts.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import shlex
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import CounterMetricFamily

from dprobe.core.gpu_registry import GPUSpecFiles, SpecFile
from dprobe.core.lazy import installed
from dprobe.core.names import OPTIMIZERS, PRECISIONS
from dprobe.services.sidecar.annotations import TRAINING_JOB, AnnotationPolicy, AnnotationsFile, Refused
from dprobe.services.sidecar.child import FAILURES, ChildFailed, ChildQueue, ChildRunner, JobLimits

__all__ = ["FAILURES", "JobFailed", "JobLimits", "JobProfile", "JobProfiles", "JobSpec", "predict_fields"]

if TYPE_CHECKING:
    from dprobe.core.gpus import GPUSpec
    from dprobe.profiling.coldstart.predict import JobPrediction

log = logging.getLogger(__name__)
ANNOTATION = TRAINING_JOB
DEFAULT_GPU = "h200"  # the GPU of the profiles the cold-start model learnt from
KEYS = ("batch", "precision", "optimizer", "image", "seq", "gpu", "host_stall", "config_kwargs", "stack", "mode")
MODES = ("train", "inference")  # dprobe predict --mode (no torch import: the spec is checked where it cannot run)
# what a profile holds: (the prediction's field, the exported name's stem)
TARGETS = (("device_memory_bytes", "gpu_memory_bytes"), ("peak_memory_bytes", "allocator_peak_bytes"),
           ("gpu_utilization", "gpu_utilization_ratio"), ("step_time_seconds", "step_seconds"))
JobFailed = ChildFailed  # why a job has no profile: its model cannot be predicted, or its child ran past a limit


@dataclass(frozen=True)
class JobSpec:
    """One training job, as ``dprobe predict`` takes it."""

    model: str
    batch: int
    precision: str = "fp32"
    optimizer: str = "adamw"
    image: int | None = None
    seq: int | None = None
    gpu: str = ""  # a GPUS key or a spec file's key (GPUSpecFiles); "": the GPU the sidecar sees (JobProfiles resolves it)
    host_stall_s: float = 0.0
    config_kwargs: str = ""  # a JSON object (keys sorted): the spec is hashable, one profile per job
    stack: str = ""  # a software stack preset (dprobe predict --stack); "": the GPU's default
    mode: str = "train"  # inference: a serving job's forward passes (dprobe predict --mode inference)

    @staticmethod
    def parse(text: str, gpus: GPUSpecFiles | None = None) -> JobSpec:
        """``MODEL batch=N [precision=P] [optimizer=O] [image=N] [seq=N] [gpu=NAME] [host_stall=S]
        [config_kwargs=JSON] [stack=PRESET] [mode=train|inference]`` (shell quoting for values with spaces); a
        ValueError naming what is wrong. ``gpu=`` names a built-in GPU or one of ``gpus`` (its name or an
        alias; a spec file's GPU wins over a built-in one of the same name)."""
        from dprobe.core.gpus import (
            GPUS,  # no torch: a job is checked where it cannot be profiled too
        )
        from dprobe.profiling.coldstart.stack import STACKS

        try:
            parts = shlex.split(text)
        except ValueError as exc:
            raise ValueError(f"{text!r}: {exc}") from exc
        if not parts:
            raise ValueError(f"{text!r}: empty; expected MODEL batch=N [key=value ...]")
        model, *opts = parts
        kw: dict[str, Any] = {}
        for opt in opts:
            key, sep, value = opt.partition("=")
            if not sep or not value:
                raise ValueError(f"{text!r}: expected key=value, got {opt!r}")
            if key not in KEYS:
                raise ValueError(f"{text!r}: unknown key {key!r} ({', '.join(KEYS)})")
            try:
                if key in ("batch", "image", "seq"):
                    kw[key] = int(value)
                elif key == "host_stall":
                    kw["host_stall_s"] = float(value)
                elif key == "config_kwargs":
                    parsed = json.loads(value)
                    if not isinstance(parsed, dict):
                        raise ValueError("must be a JSON object")
                    kw[key] = json.dumps(parsed, sort_keys=True)
                else:
                    kw[key] = value.lower()
            except ValueError as exc:  # includes json.JSONDecodeError
                raise ValueError(f"{text!r}: {key}: {exc}") from exc
        if "batch" not in kw or kw["batch"] < 1:
            raise ValueError(f"{text!r}: batch=N (>= 1) is required")
        spec_file = gpus.get(kw["gpu"]) if gpus and "gpu" in kw else None
        if spec_file is not None:
            kw["gpu"] = spec_file.key
        elif "gpu" in kw and kw["gpu"] not in GPUS:
            files = f", or a GPU of gpu_spec_files ({', '.join(gpus.keys)})" if gpus else ""
            raise ValueError(f"{text!r}: gpu must be one of {', '.join(GPUS)}{files}, got {kw['gpu']!r}")
        for key, allowed in (("precision", PRECISIONS), ("optimizer", OPTIMIZERS),
                             ("stack", tuple(STACKS)), ("mode", MODES)):
            if key in kw and kw[key] not in allowed:
                raise ValueError(f"{text!r}: {key} must be one of {', '.join(allowed)}, got {kw[key]!r}")
        if kw.get("host_stall_s", 0.0) < 0:
            raise ValueError(f"{text!r}: host_stall must be >= 0 seconds")
        if kw.get("mode") == "inference" and "optimizer" in kw:
            raise ValueError(f"{text!r}: optimizer is a training setting; leave it out with mode=inference")
        return JobSpec(model, **kw)

    def predict(self, checkpoint: str | None = None, gpu_spec: GPUSpec | None = None) -> JobPrediction:
        """The cold-start prediction (:func:`dprobe.profiling.coldstart.predict.predict_job`, as ``dprobe
        predict`` calls it; seconds on a CPU); ``gpu_spec``: the spec of a spec file's GPU (``gpu`` its key),
        as ``dprobe predict --gpu-spec`` passes it."""
        from dprobe.core.gpus import GPUS
        from dprobe.profiling.coldstart.predict import predict_job

        if gpu_spec is None and self.gpu and self.gpu not in GPUS:
            raise ValueError(f"gpu {self.gpu!r} is a spec file's GPU: its spec must be given")
        return predict_job(self.model, self.batch, self.precision, self.optimizer, image=self.image, seq=self.seq,
                           config_kwargs=self.config_kwargs or None, checkpoint=checkpoint,
                           gpu=gpu_spec or self.gpu or DEFAULT_GPU, host_stall_s=self.host_stall_s,
                           stack=self.stack or None, mode=self.mode)


def _known_gpu(name: str, otherwise: str) -> str:
    """The dprobe GPU (``h100``, ...) of a GPU name, or "" with a log line (ending in ``otherwise``) when
    dprobe has no figures for it."""
    from dprobe.core.gpus import gpu_key

    try:
        return gpu_key(name)
    except ValueError as exc:
        log.warning("job profiles: %s; %s", exc, otherwise)
        return ""


def node_gpu_name() -> str:
    """The name NVML gives the first GPU of this node ("" without one)."""
    from dprobe.services.sources.nvml import gpu_names

    names = gpu_names()
    return names[0] if names else ""


def predict_fields(spec: Mapping[str, Any], checkpoint: str | None, gpu_spec: Mapping[str, Any] | None = None,
                   gpu_spec_file: str = "") -> dict[str, Any]:
    """The profile's fields of the job ``spec`` (a :class:`JobSpec` as a dict), as JSON: what a child process
    (:mod:`dprobe.services.sidecar.child`) runs. ``gpu_spec``: the data of the spec file (``gpu_spec_file``) of
    the job's GPU, read as ``dprobe predict --gpu-spec`` reads it."""
    from dprobe.core.gpus import gpu_spec_from_dict

    gpu = gpu_spec_from_dict(gpu_spec, gpu_spec_file or "GPU spec") if gpu_spec is not None else None
    result = JobSpec(**spec).predict(checkpoint, gpu)
    return {**{key: dataclasses.asdict(getattr(result, key)) for key, _ in TARGETS}, "fits": result.fits,
            "method": result.method}


@dataclass(frozen=True)
class JobProfile:
    """A job's prediction as exported: ``values[stem][quantile]``, e.g. ``values["gpu_memory_bytes"]["0.9"]``."""

    spec: JobSpec
    values: Mapping[str, Mapping[str, float]]
    fits: str  # "yes", "maybe" or "no" (dprobe.profiling.coldstart.predict.fits_on_gpu)
    method: str = ""  # the prediction's method (learned, analytical; an inference step's, e.g. calibrated)
    gpu_spec: str = ""  # the spec file the GPU's figures came from; "": the built-in table

    @staticmethod
    def from_prediction(spec: JobSpec, result: Mapping[str, Any], gpu_spec: str = "") -> JobProfile:
        values = {stem: {"0.5": float(result[key]["p50"]), "0.9": float(result[key]["p90"])} for key, stem in TARGETS}
        return JobProfile(spec, values, str(result["fits"]), str(result.get("method", "")), gpu_spec)

    @property
    def info(self) -> dict[str, str]:
        """The job as ``dprobe_job_info``'s labels describe it."""
        s = self.spec
        return {"model": s.model, "batch": str(s.batch), "precision": s.precision, "optimizer": s.optimizer,
                "gpu": s.gpu, "fits": self.fits, "method": self.method, "gpu_spec": self.gpu_spec}


class JobProfiles(ChildQueue[JobSpec]):
    """Which job each target runs, and the profiles computed so far (one background thread, which runs
    each prediction in a child process within ``limits``).

    ``own_target`` (the sidecar's own pod, ``namespace/pod``) is listed from the start, before any
    sample of it arrives. A job whose prediction fails, or whose child runs past a limit, is logged once
    and counted by reason (:data:`FAILURES`, exported by :meth:`collect`).
    The pod annotation, where there is one, overrides ``default`` when ``policy`` allows what it names
    (a refused one leaves those targets without a profile); :meth:`refresh` follows it when it changes.
    ``gpu``: this node's GPU name (or a function giving it, called once when first needed).
    ``gpu_specs``: GPUs of spec files (or the paths to read them from: :meth:`GPUSpecFiles.load`), which jobs
    may name and which a GPU's name is matched against before the built-in table.
    """

    thread_name = "job-profiles"

    def __init__(self, jobs: Mapping[str, str] | None = None, default: str = "", annotations_file: str = "",
                 own_target: str = "", checkpoint: str | None = None,
                 predict: Callable[[JobSpec], Mapping[str, Any]] | None = None,
                 gpu: str | Callable[[], str] = node_gpu_name, policy: AnnotationPolicy | None = None,
                 limits: JobLimits | None = None, runner: ChildRunner | None = None,
                 gpu_specs: GPUSpecFiles | Iterable[str] | None = None):
        self.gpu_specs = gpu_specs if isinstance(gpu_specs, GPUSpecFiles) else GPUSpecFiles.load(gpu_specs or ())
        self.patterns = {glob: JobSpec.parse(text, self.gpu_specs) for glob, text in (jobs or {}).items()}
        self.configured = JobSpec.parse(default, self.gpu_specs) if default else None
        self.default = self.configured
        self.policy = policy or AnnotationPolicy()
        self.runner = runner or ChildRunner(limits)  # shared with the model graphs: one child at a time
        self.limits = self.runner.limits
        self.checkpoint = checkpoint
        self.annotations = AnnotationsFile(annotations_file, ANNOTATION) if annotations_file else None
        if self.annotations is not None and self.annotations.value:
            try:
                self.default = self._annotated(self.annotations.value)
            except ValueError as exc:
                raise ValueError(f"{annotations_file}: annotation {ANNOTATION}: {exc}") from exc
        if self.active and predict is None and not installed("torch"):
            raise ValueError("job profiles (job, jobs, the dprobe.io/training-job annotation) replay the job's "
                             "model with torch, which is not installed here: install the training stack "
                             "(`pip install 'dprobe[train]'`, or use the full image), or leave the job out")
        self._node_gpu = gpu  # jobs that do not name their GPU run on their target's, else this node's
        self._model_gpus: dict[str, str] = {}  # a GPU's model name -> the dprobe GPU it is predicted for
        self.own_target = own_target
        self._predict = predict or self._predict_in_child
        self._profiles: dict[JobSpec, JobProfile | None] = {}  # None: queued or failed
        super().__init__()
        self._lock = threading.Lock()
        self.failures_total = dict.fromkeys(FAILURES, 0)

    @property
    def active(self) -> bool:
        return bool(self.patterns or self.default)

    @property
    def errors_total(self) -> int:
        """Jobs without a profile, whatever the reason."""
        return sum(self.failures_total.values())

    def _annotated(self, text: str) -> JobSpec | None:
        """The job an annotation names, as the policy allows it (None when refused: logged and counted); a
        ValueError when it does not parse."""
        spec = JobSpec.parse(text, self.gpu_specs)
        try:
            model = self.policy.model(spec.model)
            self.policy.config_kwargs(spec.config_kwargs)
            return replace(spec, model=model)
        except Refused as exc:
            self.policy.refuse(ANNOTATION, text, exc, "targets without a job of their own get no cold-start "
                               "profile")
            return None

    def refresh(self) -> bool:
        """Follow a changed ``dprobe.io/training-job`` annotation; True when the default job changed. An
        annotation that does not parse is logged and the job stays what it was."""
        if self.annotations is None or not self.annotations.changed():
            return False
        text = self.annotations.value
        try:
            default = self._annotated(text) if text else self.configured
        except ValueError as exc:
            log.warning("annotation %s=%r ignored: %s; the job stays %s", ANNOTATION, text, exc,
                        self.default.model if self.default else "none")
            return False
        if default == self.default:
            return False
        log.info("annotation %s changed: targets without a job of their own now run %s", ANNOTATION,
                 f"{default.model} (batch {default.batch}, {default.precision})" if default else "none")
        self.default = default
        return True

    def spec(self, target: str, gpu_model: str = "") -> JobSpec | None:
        """The job ``target`` runs; without ``gpu=``, on ``gpu_model`` (its GPU's model name, as
        dcgm-exporter's ``modelName``), else on the GPU NVML sees here, else the H200."""
        spec = next((s for pattern, s in self.patterns.items() if fnmatch.fnmatchcase(target, pattern)),
                    self.default)
        if spec is None or spec.gpu:
            return spec
        return replace(spec, gpu=self._gpu_of(gpu_model))

    def _gpu_of(self, gpu_model: str) -> str:
        if gpu_model not in self._model_gpus:  # resolved (and logged) once per name
            gpu = self._named_gpu(gpu_model, "jobs on it without gpu= are predicted for this node's GPU"
                                  ) if gpu_model else ""
            if not gpu:
                if callable(self._node_gpu):
                    self._node_gpu = self._node_gpu()
                    if not self._node_gpu:
                        log.info("job profiles: no GPU seen through NVML; jobs without gpu= on GPUs of unknown "
                                 "model are predicted for the %s", DEFAULT_GPU.upper())
                gpu = self._named_gpu(self._node_gpu, f"jobs without gpu= are predicted for the "
                                      f"{DEFAULT_GPU.upper()}") if self._node_gpu else ""
            gpu = gpu or DEFAULT_GPU
            self._model_gpus[gpu_model] = gpu
        return self._model_gpus[gpu_model]

    def _named_gpu(self, name: str, otherwise: str) -> str:
        """The GPU a device name is predicted for: a spec file's that names it, else the built-in table's, else
        "" (logged, ending in ``otherwise``)."""
        found = self.gpu_specs.match(name)
        if found is None:
            return _known_gpu(name, otherwise)
        log.info("job profiles: GPU %r is predicted with the spec file %s (%s%s)", name, found.path, found.spec.name,
                 ", calibrated" if found.calibrated else "")
        return found.key

    def spec_file(self, spec: JobSpec) -> SpecFile | None:
        """The spec file of a job's GPU (None: a built-in GPU)."""
        return self.gpu_specs.get(spec.gpu)

    def profiles(self, targets: list[str], gpu_models: Mapping[str, str] | None = None) -> dict[str, JobProfile]:
        """The ready profiles of ``targets`` (and of the own pod); jobs not yet seen are queued. ``gpu_models``:
        each target's GPU model name, where its samples give one."""
        out = {}
        gpu_models = gpu_models or {}
        names = [*targets, self.own_target] if self.own_target and self.own_target not in targets else targets
        for target in names:
            spec = self.spec(target, gpu_models.get(target, ""))
            if spec is None:
                continue
            with self._lock:
                known = spec in self._profiles
                profile = self._profiles.get(spec)
                if not known:
                    self._profiles[spec] = None
            if not known:
                self._queue.put(spec)
            if profile is not None:
                out[target] = profile
        return out

    def _compute(self, spec: JobSpec) -> None:
        try:
            spec_file = self.spec_file(spec)
            profile = JobProfile.from_prediction(spec, self._predict(spec), spec_file.path if spec_file else "")
        except Exception as exc:  # an unknown model or one that cannot be replayed must not stop the sidecar
            if self.runner.stopping:
                return
            reason = exc.reason if isinstance(exc, JobFailed) and exc.reason in FAILURES else "error"
            with self._lock:
                self.failures_total[reason] += 1
            log.warning("no cold-start profile for job %s: %s", spec.model,
                        exc if isinstance(exc, JobFailed) else f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            self._profiles[spec] = profile
        log.info("cold-start profile of %s (batch %d, %s): GPU memory p50 %.2f GiB, utilisation p50 %.0f %%, "
                 "step %.3f s; fits: %s", spec.model, spec.batch, spec.precision,
                 profile.values["gpu_memory_bytes"]["0.5"] / 2**30,
                 100 * profile.values["gpu_utilization_ratio"]["0.5"], profile.values["step_seconds"]["0.5"],
                 profile.fits)

    def _predict_in_child(self, spec: JobSpec) -> dict[str, Any]:
        """``spec.predict`` in a child process within :attr:`limits` (:class:`ChildRunner`); a
        :class:`JobFailed` naming why when it fails or runs past a limit (it is killed then)."""
        spec_file = self.spec_file(spec)  # the file's data: the child builds the spec as --gpu-spec does
        gpu = {"gpu_spec": dict(spec_file.data), "gpu_spec_file": spec_file.path} if spec_file else {}
        return self.runner.run("job", {"spec": dataclasses.asdict(spec), "checkpoint": self.checkpoint, **gpu})

    def collect(self) -> Iterator[CounterMetricFamily]:
        fam = CounterMetricFamily("dprobe_job_profile_errors", "Training jobs left without a cold-start profile, "
                                  "by reason: error (the model cannot be predicted), timeout, cpu, memory (past "
                                  "a limit of its child process), killed.", labels=["reason"])
        with self._lock:
            for reason, count in self.failures_total.items():
                fam.add_metric([reason], count)
        yield fam

