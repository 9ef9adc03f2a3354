"""Cold-start prediction of one training job from its model alone."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from dprobe.core.gpus import GPUS, GPUSpec, spec_as_dict
from dprobe.graph.onnx_reader import read_onnx
from dprobe.graph.schema import ModelGraph
from dprobe.graph.zoo import VALUES_ASSUMED_NOTE, parse_spec
from dprobe.profiling.coldstart.features import (
    FEATURES,
    MODES,
    analytical_for,
    job_features,
    with_host_factor,
)
from dprobe.profiling.coldstart.graph_estimate import estimate_from_graph
from dprobe.profiling.coldstart.job import JobInputs, job_inputs
from dprobe.profiling.coldstart.model import TARGETS
from dprobe.profiling.coldstart.replay import ReplayEstimate
from dprobe.profiling.coldstart.stack import SoftwareStack, StackChoice, resolve_stack

DEFAULT_CHECKPOINT = Path(__file__).with_name("default_coldstart.pt")
ONNX_NOTE = ("ONNX file: the step is estimated from the graph's nodes, not replayed; an export for inference "
             "(batch norms folded, no dropout) comes out low on memory: export with "
             "training=torch.onnx.TrainingMode.TRAINING (docs/graph-and-coldstart.md)")


@dataclass(frozen=True)
class Band:
    """A predicted quantity's p50 and p90."""

    p50: float
    p90: float


class Bands(TypedDict):
    """The four targets' bands, keyed as :class:`JobPrediction`'s fields (``**bands`` fills them)."""

    peak_memory_bytes: Band
    device_memory_bytes: Band
    gpu_utilization: Band
    step_time_seconds: Band


class _JobSettings(TypedDict):
    """The keyword arguments of :func:`~dprobe.profiling.coldstart.job.job_inputs` that a job's replays
    share."""

    image: int | None
    seq: int | None
    config_kwargs: dict | str | None
    gpu: GPUSpec
    stack: SoftwareStack
    host_factor: float


@dataclass(frozen=True)
class AnalyticalEstimate:
    """The replay's own figures for the job, before the learned corrections."""

    peak_memory_bytes: int
    device_memory_bytes: int
    gpu_utilization: float  # with the host stalls
    step_time_seconds: float
    param_bytes: int
    optimizer_state_bytes: int
    activation_bytes: int
    flops_per_step: float
    kernels_per_step: int
    gpu_seconds_per_step: float  # the per-kernel roofline of a step: GPU busy time
    host_seconds_per_step: float  # and the host's time to issue its ops


@dataclass
class JobPrediction:
    """What ``dprobe predict`` says of a job; :meth:`as_dict` is its JSON (``--json``)."""

    model: str
    batch: int
    precision: str
    optimizer: str
    gpu: str
    host_stall_s: float
    host_factor: float
    unknown_nodes: int  # graph nodes of ops dprobe does not know
    graph_nodes: int
    method: str  # "learned" (corrected by the checkpoint) or "analytical"
    checkpoint: str | None  # the cold-start checkpoint (None: the analytical estimate alone)
    peak_memory_bytes: Band  # the training peak of the PyTorch allocator
    device_memory_bytes: Band  # what NVML / DCGM will show
    gpu_utilization: Band  # 0-1
    step_time_seconds: Band
    gpu_memory_bytes: int  # the GPU's memory
    fits: str  # "yes", "maybe" or "no" (:func:`fits_on_gpu`)
    analytical: AnalyticalEstimate
    gpu_seen_in_training: bool = True  # whether the checkpoint learnt from runs on this GPU
    largest_batch: int | None = None  # the largest batch predicted to fit (0: none; None: not searched)
    gpu_spec: dict[str, Any] | None = None  # the GPU's figures (--gpu-spec's fields)
    stack: dict[str, Any] | None = None  # the software stack assumed (SoftwareStack.as_dict)
    grad_checkpointing: bool = False
    mode: str = "train"  # "train": a training step; "inference": a forward pass in eval mode (--mode)
    # the replay roofline the step time's features were put on (dprobe.profiling.coldstart.features.ROOFLINES):
    # "plain", or for --mode inference the inference step model's own
    roofline: str = "plain"
    # how the memory was calibrated: the source that measured this GPU's stack, or the factors for one that
    # none measured (dprobe.profiling.coldstart.memory_sources)
    memory_calibration: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    # where the JSON has the note: after the key that stood last when the first note was added
    note_after: str = "graph_nodes"
    graph: ModelGraph | None = field(default=None, repr=False, compare=False)  # the model graph predicted from

    @property
    def note(self) -> str:
        """The notes, separated by "; " ("" without any)."""
        return "; ".join(self.notes)

    def add_note(self, text: str) -> None:
        """Append ``text`` to the prediction's notes."""
        if not self.notes:
            self.note_after = next(reversed(self._items()))
        self.notes.append(text)

    def _items(self) -> dict[str, Any]:
        """The JSON's keys and values but the note."""
        head = {k: getattr(self, k) for k in ("model", "mode", "batch", "precision", "optimizer", "gpu",
                                               "host_stall_s", "host_factor", "unknown_nodes", "graph_nodes",
                                               "method")}
        if self.checkpoint is not None:
            head["checkpoint"] = self.checkpoint
        head["roofline"] = self.roofline
        out = {**head, **{t: asdict(getattr(self, t)) for t in TARGETS}, "gpu_memory_bytes": self.gpu_memory_bytes,
               "fits": self.fits, "largest_batch": self.largest_batch,
               "gpu_seen_in_training": self.gpu_seen_in_training, "gpu_spec": self.gpu_spec,
               "stack": self.stack, "analytical": asdict(self.analytical)}
        if self.memory_calibration is not None:
            out["memory_calibration"] = self.memory_calibration
        if self.grad_checkpointing:
            out["grad_checkpointing"] = True
        return out

    def as_dict(self) -> dict[str, Any]:
        """The prediction as ``dprobe predict --json`` prints it."""
        out: dict[str, Any] = {}
        for key, value in self._items().items():
            out[key] = value
            if key == self.note_after and self.notes:
                out["note"] = self.note
        return out


def predict_job(model: str, batch: int, precision: str = "fp32", optimizer: str = "adamw",
                image: int | None = None, seq: int | None = None, config_kwargs: dict | str | None = None,
                checkpoint: str | Path | None = None, gpu: str | GPUSpec = "h200", host_stall_s: float = 0.0,
                host_factor: float = 1.0, grad_checkpointing: bool = False,
                search_batch: bool = False, stack: StackChoice = None, mode: str = "train",
                reparameterize: bool = False, compiled: bool = False) -> JobPrediction:
    """Predict peak allocator bytes, NVML bytes, GPU utilisation and step time (p50 and p90 each).

    The one entry point of a cold-start prediction: ``dprobe predict``, the sidecar and the benchmarks call
    it, and its features are built as the training sets' are (:func:`~dprobe.profiling.coldstart.job.job_inputs`).

    ``host_stall_s``: seconds per step, on average, that the GPU waits on the host (data loading,
    evaluation, checkpointing); it lowers utilisation, not the step time (a step's own duration).
    ``host_factor``: how slowly the machine's host (CPU, Python, driver) issues ops against the typical
    machine of the training data (1); e.g. 1.4 for a host that takes 40 % longer to launch each kernel.
    ``grad_checkpointing``: the job turns a ``transformers`` or timm model's gradient checkpointing on
    (``gradient_checkpointing_enable()``, ``set_grad_checkpointing()``): its blocks keep their inputs
    only and recompute.
    ``gpu``: a key of ``GPUS`` or a :class:`GPUSpec` (``--gpu-spec FILE``, :func:`~dprobe.core.gpus.load_gpu_spec`).
    ``search_batch``: also find the largest batch predicted to fit the GPU (``largest_batch``; a replay or
    three more, :func:`largest_fitting_batch`).
    ``stack``: the software stack the job runs on (:func:`~dprobe.profiling.coldstart.stack.resolve_stack`:
    a preset's name, a mapping of settings over the GPU's default, or a ``SoftwareStack``); default: the
    stack the GPU's training runs were measured on. Its attention kernels are replayed, its
    ``cudnn.benchmark`` is a feature; the prediction's ``stack`` says what was assumed.
    ``mode``: ``train`` (a training step) or ``inference`` (one forward pass in eval mode under
    ``torch.no_grad()``, as a serving process runs the batch: :func:`predict_inference_job`).
    ``reparameterize`` and ``compiled`` (``--reparameterize``, ``--compile``): inference settings
    (:func:`predict_inference_job`), refused for a training step.
    """
    from dprobe.graph.build import build_model_graph
    from dprobe.graph.schema import GraphError
    from dprobe.graph.trace import SINGLE_VALUE_BATCHNORM
    from dprobe.graph.zoo import remedy

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} ({', '.join(MODES)})")
    software = check_job(batch, image, seq, host_stall_s, host_factor, gpu, stack, mode)
    if mode != "inference" and (reparameterize or compiled):
        raise ValueError(f"{'--reparameterize' if reparameterize else '--compile'} is predicted for --mode inference "
                         "only (no training table measured it)")
    if mode == "inference":
        if grad_checkpointing:
            raise ValueError("--grad-checkpointing is a training setting: --mode inference keeps no activations "
                             "for a backward pass")
        return predict_inference_job(model, batch, precision, image=image, seq=seq, config_kwargs=config_kwargs,
                                     gpu=gpu, host_stall_s=host_stall_s, host_factor=host_factor,
                                     search_batch=search_batch, stack=software, reparameterize=reparameterize,
                                     compiled=compiled)
    coldstart = _coldstart_checkpoint(checkpoint)
    spec, gpu = (gpu, gpu.name) if isinstance(gpu, GPUSpec) else (GPUS[gpu], gpu)
    parsed = parse_spec(model, config_kwargs)
    channels_last = software.memory_format == "nhwc" and parsed.lib != "transformers"
    notes: list[str] = []
    job = _JobSettings(image=image, seq=seq, config_kwargs=config_kwargs, gpu=spec, stack=software,
                       host_factor=host_factor)
    if parsed.lib == "onnx":  # a graph, no module to replay: estimate from its nodes
        if grad_checkpointing:
            raise ValueError("--grad-checkpointing needs the model as a transformers or timm module, not an ONNX file")
        graph = read_onnx(model, batch=batch, seq=seq)
        est = estimate_from_graph(graph, batch, precision, optimizer)
        return _predict(model, batch, precision, optimizer, graph, job_inputs(model, batch, precision, optimizer,
                        est=est, **job), gpu, coldstart, host_stall_s, host_factor, notes=[ONNX_NOTE, *notes])
    try:
        inputs = job_inputs(model, batch, precision, optimizer, grad_checkpointing=grad_checkpointing, **job)
    except Exception as exc:  # noqa: BLE001 - a model's forward can fail in any way; name it, no traceback
        if isinstance(exc, GraphError):  # the model itself refused by name (unknown, no checkpointing, ...)
            raise
        if SINGLE_VALUE_BATCHNORM in str(exc):
            raise ValueError(f"{model} cannot train at batch {batch}: a batch norm layer sees one value per "
                             f"channel there and PyTorch refuses it ({exc}); predict for a larger --batch") from exc
        # e.g. an op with no meta kernel, one PyTorch would refuse on the GPU too (fp32 grouped_mm), or a
        # forward that wants other inputs than an image batch or token ids
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        hint = (" (for a model with other inputs, give a module:pkg.mod:factory whose model has an "
                "example_inputs(batch) method)" if isinstance(exc, TypeError) else "")
        raise ValueError(f"cannot replay a training step ({precision}) of {model}: {type(exc).__name__}: "
                         f"{first}{hint}{remedy(exc)}") from exc
    graph = build_model_graph(model, batch=batch, image=image, seq=seq, config_kwargs=config_kwargs)
    result = _predict(model, batch, precision, optimizer, graph, inputs, gpu, coldstart, host_stall_s, host_factor,
                      notes=notes)
    if channels_last:
        _with_layout(result)
    if inputs.est.values_assumed:
        result.add_note(f"replayed with {VALUES_ASSUMED_NOTE}")
    if search_batch:
        result.largest_batch = largest_fitting_batch(result, inputs.est, image=image, seq=seq,
                                                     config_kwargs=config_kwargs,
                                                     grad_checkpointing=grad_checkpointing, stack=software)
    if grad_checkpointing:
        plain = job_inputs(model, batch, precision, optimizer, **job)
        _with_recompute_timing(result, _predict(model, batch, precision, optimizer, graph, plain, gpu,
                                                coldstart, host_stall_s, host_factor))
    return result


def predict_inference_job(model: str, batch: int, precision: str = "fp32", *, image: int | None = None,
                          seq: int | None = None, config_kwargs: dict | str | None = None,
                          gpu: str | GPUSpec = "h200", host_stall_s: float = 0.0, host_factor: float = 1.0,
                          search_batch: bool = False, stack: StackChoice = None, reparameterize: bool = False,
                          compiled: bool = False) -> JobPrediction:
    """:func:`predict_job` of an inference step: the forward pass replayed in eval mode under
    ``torch.no_grad()`` (:func:`~dprobe.profiling.coldstart.replay.replay_inference_step`); the step time is
    the inference model's (:func:`~dprobe.profiling.coldstart.inference.predict_inference_step`, fitted on
    timm's inference benchmarks); memory and utilisation are the replay's own (no inference run measured
    them). A host slower than the typical one (``host_factor``) bounds the step from below by its issue time.
    The stack's memory format is replayed (channels-last: :func:`~dprobe.profiling.coldstart.replay.to_channels_last`)
    and its step corrected by timm's channels-last table; ``reparameterize``: the model fused for inference
    first (timm's ``reparameterize_model``); ``compiled``: ``torch.compile`` (default mode), the eager
    prediction times a calibrated factor (:mod:`~dprobe.profiling.coldstart.settings`). ``method`` says
    which ran (e.g. ``gpu-factor+layout-rule``)."""
    from dprobe.graph.build import build_model_graph
    from dprobe.graph.schema import GraphError
    from dprobe.graph.zoo import remedy
    from dprobe.profiling.coldstart.inference import DEFAULT_MODEL as INFERENCE_MODEL
    from dprobe.profiling.coldstart.inference import load_inference_model
    from dprobe.profiling.coldstart.residual import apply_stall, baseline, with_stall
    from dprobe.profiling.coldstart.settings import default_settings, predict_setting_step

    software = check_job(batch, image, seq, host_stall_s, host_factor, gpu, stack, mode="inference")
    spec, gpu = (gpu, gpu.name) if isinstance(gpu, GPUSpec) else (GPUS[gpu], gpu)
    if parse_spec(model, config_kwargs).lib == "onnx":
        raise ValueError("--mode inference replays a module's forward pass: give the model as a torchvision, "
                         "timm or transformers name (an ONNX file is estimated for training only)")
    try:
        est = analytical_for(model, batch, precision, "none", image=image, seq=seq, config_kwargs=config_kwargs,
                             attention=software.attention, mode="inference", memory_format=software.memory_format,
                             reparameterize=reparameterize)
    except GraphError:
        raise
    except Exception as exc:  # noqa: BLE001 - a model's forward can fail in any way; name it, no traceback
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        raise ValueError(f"cannot replay an inference step ({precision}) of {model}: {type(exc).__name__}: "
                         f"{first}{remedy(exc)}") from exc
    feats = with_host_factor(np.array(job_features(est, batch, precision, "none", spec)), math.log(host_factor))
    base = baseline(est, feats)
    steps = load_inference_model()
    timed, rep_note = est, ""
    if reparameterize and not default_settings().reparameterized_step():  # the plain replay's step ships
        timed = analytical_for(model, batch, precision, "none", image=image, seq=seq, config_kwargs=config_kwargs,
                               attention=software.attention, mode="inference",
                               memory_format=software.memory_format)
        rep_note = ("; step time from the model as built (the fused replay's did not beat it on every family of "
                    "timm's fused tables: docs/graph-and-coldstart.md, Settings)")
    setting = predict_setting_step(timed, precision, spec, memory_format=software.memory_format, compiled=compiled,
                                   model=steps)
    step50, step90 = setting.p50, setting.p90
    host = math.exp(feats[FEATURES.index("log_t_host")])  # on this host: the step is at least its issue time
    step50, step90 = max(step50, host), max(step90, host)
    busy = float(np.clip(math.exp(feats[FEATURES.index("log_t_gpu")]) / step50, 0.05, 0.95))
    p50 = np.array([est.peak_bytes, est.device_bytes, busy, step50])
    p90 = np.array([est.peak_bytes * 1.05, est.device_bytes * 1.07, min(busy + 0.2, 1.0), step90])
    memory_notes: list[str] = []
    calibration = (_unseen_memory(p50, p90, memory_notes) if gpu not in MEMORY_MEASURED_GPUS
                   else {"source": "measured", "gpu": gpu, "p50_factor": 1.0, "p90_factor": 1.0})
    apply_stall(p50, p90, np.float64(host_stall_s))
    bands = _bands(p50, p90)
    graph = build_model_graph(model, batch=batch, image=image, seq=seq, config_kwargs=config_kwargs)
    seen = gpu in steps.trained_on
    notes = [] if seen else [f"gpu_seen_in_training: false: the inference step model learnt from "
                             f"{', '.join(steps.trained_on)} only, its p90 from GPUs held out in turn"]
    _, step_why = steps.explain(spec)  # which predictor ran and why (a calibrated GPU: its measured peaks)
    notes.append(step_why)
    notes.extend(setting.notes)
    if reparameterize:
        notes.append("re-parameterised: replayed after timm's reparameterize_model (branches and batch norms fused "
                     "into convolutions), as timm's PyTorch 2.9 inference benchmark runs such models; memory and "
                     f"kernels the fused model's{rep_note}")
    if precision != "fp16":
        notes.append(f"{precision}: the inference step model learnt from fp16 autocast runs only; the roofline "
                     f"puts the step at {precision}'s peaks and the fp16 runs' corrections are applied")
    notes.append("memory and utilisation: the replay's own (no inference run measured them)")
    notes.extend(memory_notes)
    analytical = AnalyticalEstimate(
        peak_memory_bytes=int(est.peak_bytes), device_memory_bytes=int(est.device_bytes),
        gpu_utilization=round(float(with_stall(base[2], base[3], host_stall_s)), 4),
        step_time_seconds=float(base[3]), param_bytes=int(est.param_bytes), optimizer_state_bytes=0,
        activation_bytes=int(est.activation_bytes), flops_per_step=est.flops, kernels_per_step=int(est.kernels),
        gpu_seconds_per_step=math.exp(feats[FEATURES.index("log_t_gpu")]), host_seconds_per_step=host)
    result = JobPrediction(
        model=model, batch=batch, precision=precision, optimizer="none", gpu=gpu, host_stall_s=host_stall_s,
        host_factor=host_factor, unknown_nodes=graph.unknown_nodes, graph_nodes=len(graph.nodes),
        method=setting.method + ("" if not reparameterize else "+reparam-fused" if timed is est else "+reparam-proxy"),
        checkpoint=str(INFERENCE_MODEL), **bands, gpu_memory_bytes=int(spec.memory_bytes),
        fits=fits_on_gpu(bands["peak_memory_bytes"].p50, bands["device_memory_bytes"].p90, spec.memory_bytes),
        analytical=analytical, gpu_seen_in_training=seen, gpu_spec=spec_as_dict(spec),
        stack=software.as_dict(), mode="inference", roofline=steps.roofline, notes=notes, note_after="graph_nodes",
        graph=graph, memory_calibration=calibration)
    if est.values_assumed:
        result.add_note(f"replayed with {VALUES_ASSUMED_NOTE}")
    if search_batch:
        result.largest_batch = largest_fitting_batch(result, est, image=image, seq=seq, config_kwargs=config_kwargs,
                                                     stack=software)
    return result


def check_job(batch: int, image: int | None = None, seq: int | None = None, host_stall_s: float = 0.0,
              host_factor: float = 1.0, gpu: str | GPUSpec = "h200", stack: StackChoice = None,
              mode: str = "train") -> SoftwareStack:
    """The job's software stack (:func:`~dprobe.profiling.coldstart.stack.resolve_stack`), or a ValueError
    naming the option for a job that cannot be: a batch, image side or sequence length below 1, a host
    stall that is negative or infinite, a host factor that is not a positive number, an unknown GPU, an
    unknown stack or setting."""
    for flag, value in (("--batch", batch), ("--image", image), ("--seq", seq)):
        if value is not None and not value >= 1:
            raise ValueError(f"{flag} must be >= 1, not {value}")
    if not 0 <= host_stall_s < float("inf"):
        raise ValueError(f"--host-stall must be >= 0 seconds, not {host_stall_s}")
    if not 0 < host_factor < float("inf"):
        raise ValueError(f"--host-factor must be a positive number, not {host_factor}")
    if not isinstance(gpu, GPUSpec) and gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r} ({', '.join(GPUS)}; --gpu-spec FILE for another)")
    return resolve_stack(gpu.name if isinstance(gpu, GPUSpec) else gpu, stack, mode)


def _coldstart_checkpoint(checkpoint: str | Path | None) -> tuple[Path, Any, dict[str, Any]] | None:
    """The cold-start checkpoint to predict with, loaded (path, network, its dict): ``checkpoint``, else the
    shipped one; None where there is neither (the analytical estimate alone)."""
    from dprobe.profiling.coldstart.checkpoint import load_checkpoint

    path = Path(checkpoint) if checkpoint else (DEFAULT_CHECKPOINT if DEFAULT_CHECKPOINT.is_file() else None)
    return None if path is None else (path, *load_checkpoint(path))


def _with_layout(result: JobPrediction) -> None:
    """A channels-last training job's step time: the checkpoint's times the layout factor where it ships
    (:func:`~dprobe.profiling.coldstart.settings.train_layout_step`), with the method and a note."""
    from dprobe.profiling.coldstart.settings import train_layout_step

    band = result.step_time_seconds
    p50, p90, suffix, note = train_layout_step(band.p50, band.p90)
    result.step_time_seconds = Band(p50, p90)
    if suffix:
        result.method = f"{result.method}+{suffix}"
    result.add_note(note)


def _with_recompute_timing(result: JobPrediction, plain: JobPrediction) -> None:
    """A gradient-checkpointed job's prediction: memory from its own replay, step time from the same job
    without checkpointing (what the learned corrections know) scaled by the replays' step ratio (the
    recomputed forwards), utilisation as without it. The learned model saw no checkpointed run, and
    on its own would let the smaller activations bend the timing."""
    ratio = result.analytical.step_time_seconds / plain.analytical.step_time_seconds
    result.step_time_seconds = Band(plain.step_time_seconds.p50 * ratio, plain.step_time_seconds.p90 * ratio)
    result.gpu_utilization = plain.gpu_utilization
    result.grad_checkpointing = True
    result.add_note("gradient checkpointing: memory replayed with it (layers keep their inputs and recompute "
                    f"in backward), step time {ratio:.2f}x that of the same job without it")


MEMORY_MEASURED_GPUS = ("h200", "rtx3090")  # GPUs whose training runs' memory the shipped model learnt from


def _unseen_memory(p50: np.ndarray, p90: np.ndarray, notes: list[str]) -> dict[str, Any]:
    """Memory (the first two targets) on a GPU / stack no source measured: p50 and p90 times the factors of
    :mod:`~dprobe.profiling.coldstart.memory_sources` (the spread between the sources that were), in place;
    a note; what was applied, for the JSON."""
    from dprobe.profiling.coldstart.memory_sources import load_sources

    unseen = load_sources()
    p50[:2] *= unseen.p50_factor
    p90[:2] *= unseen.p50_factor * unseen.p90_factor
    notes.append(unseen.note())
    return {"source": "none measured", "p50_factor": round(unseen.p50_factor, 4),
            "p90_factor": round(unseen.p50_factor * unseen.p90_factor, 4),
            "sources": [s.name for s in unseen.sources]}


def fits_on_gpu(peak_p50: float, device_p90: float, gpu_bytes: float) -> str:
    """"no" when the allocator's predicted peak and the CUDA context exceed the GPU's memory (the step
    runs out of memory), "maybe" when the device memory's p90 does (the caching allocator, short of
    memory, frees its cache and retries, so a job near the limit can still fit), else "yes"."""
    from dprobe.profiling.coldstart.replay import CUDA_CONTEXT_BYTES

    if peak_p50 + CUDA_CONTEXT_BYTES > gpu_bytes:
        return "no"
    return "maybe" if device_p90 > gpu_bytes else "yes"


def _as_seen(feats: np.ndarray, precision: str, net: Any, notes: list[str]) -> np.ndarray:
    """The network's input (the features mark fp16, bf16 and bf16-pure alike as "half", each replayed and
    put on the roofline at its own peak); ``notes`` get one for bf16-pure."""
    if precision == "bf16-pure":
        notes.append("bf16-pure: the replay holds weights, gradients and optimizer states in bf16, the learned "
                     "corrections are those of the bf16 autocast runs")
    return feats


def _band(target: str, p50: float, p90: float) -> Band:
    """A target's p50 and p90 as the prediction gives them (p90 at least the p50): bytes whole, utilisation
    within 0-1 to four places."""
    hi = max(float(p90), float(p50))
    if target == "gpu_utilization":
        return Band(round(float(np.clip(p50, 0, 1)), 4), round(float(np.clip(hi, 0, 1)), 4))
    if target == "step_time_seconds":
        return Band(float(p50), hi)
    return Band(int(p50), int(hi))


def _bands(p50: np.ndarray, p90: np.ndarray) -> Bands:
    """:func:`_band` of each target (``TARGETS``' order in ``p50`` and ``p90``)."""
    band = {t: _band(t, p50[i], p90[i]) for i, t in enumerate(TARGETS)}
    return Bands(peak_memory_bytes=band["peak_memory_bytes"], device_memory_bytes=band["device_memory_bytes"],
                 gpu_utilization=band["gpu_utilization"], step_time_seconds=band["step_time_seconds"])


def _predict(model: str, batch: int, precision: str, optimizer: str, graph: ModelGraph, inputs: JobInputs,
             gpu: str, coldstart: tuple[Path, Any, dict[str, Any]] | None, host_stall_s: float,
             host_factor: float = 1.0, notes: list[str] | None = None) -> JobPrediction:
    """The prediction from the job's inputs (:func:`~dprobe.profiling.coldstart.job.job_inputs`), corrected by
    the loaded cold-start checkpoint ``coldstart`` (:func:`_coldstart_checkpoint`; None: the analytical
    estimate alone)."""
    from dprobe.profiling.coldstart.residual import apply_stall, predict_targets, uses_graphs, with_stall

    est, feats, base, spec = inputs.est, inputs.feats, inputs.base, inputs.gpu
    stack_factor = None
    notes = list(notes or [])  # of the job as the model sees it: they follow graph_nodes in the JSON
    if coldstart is not None:
        ckpt_path, net, ckpt = coldstart
        trained_on = ckpt.get("gpus", ["h200"])  # checkpoints before it was recorded: h200-profiles
        seen = gpu in trained_on
        # wider p90 on a GPU the checkpoint never saw, where it learnt how much (GPUs held out in turn)
        widen = ckpt.get("unseen_gpu_p90_shift", {}) if not seen else {}
        if uses_graphs(net):
            from dprobe.graph.encoder import graph_to_data

            graphs = [graph_to_data(graph)]
        else:
            graphs = [None]
        p50, p90 = predict_targets(net, graphs, np.array([_as_seen(feats, precision, net, notes)]),
                                   base[None], np.array([widen.get(t, 0.0) for t in TARGETS]))
        p50, p90 = p50[0], p90[0]
        stack_factor = ckpt.get("memory_factors", {}).get(gpu)
        if stack_factor:  # the memory of the stack this GPU's fit labels came from, against the replay's
            p50[:2] *= stack_factor
            p90[:2] *= stack_factor
            notes.append(f"memory x{stack_factor:.3f}: learnt from {gpu}'s fit / does-not-fit labels (their "
                         "software stack's context and workspaces)")
        method, checkpoint = "learned", str(ckpt_path)
    else:
        p50, p90 = base.copy(), base * np.array([1.05, 1.07, 1.0, 1.3])
        p90[2] = min(base[2] + 0.2, 1.0)
        method, checkpoint = "analytical", None
        trained_on, seen = list(GPUS), gpu in GPUS
    note_after = "graph_nodes" if notes else ("checkpoint" if checkpoint else "method")
    if coldstart is None:
        notes.append("no checkpoint: analytical estimate only")
    memory_seen = gpu in (trained_on if coldstart is not None else MEMORY_MEASURED_GPUS)
    calibration = _unseen_memory(p50, p90, notes) if not memory_seen else {
        "source": "measured", "gpu": gpu, "p50_factor": float(stack_factor or 1.0) if coldstart else 1.0,
        "p90_factor": 1.0}
    apply_stall(p50, p90, np.float64(host_stall_s))
    if coldstart is not None and not seen:
        widened = sorted(k for k, v in coldstart[2].get("unseen_gpu_p90_shift", {}).items() if v > 0)
        notes.append(f"gpu_seen_in_training: false: trained on {', '.join(trained_on)} measurements only, not "
                     f"{gpu}, whose corrections are those learnt across those GPUs" + (
                         f", p90 widened as a GPU held out in training needed ({', '.join(widened)})"
                         if widened else ""))
    bands = _bands(p50, p90)
    analytical = AnalyticalEstimate(
        peak_memory_bytes=int(base[0]), device_memory_bytes=int(base[1]),
        gpu_utilization=round(float(with_stall(base[2], base[3], host_stall_s)), 4), step_time_seconds=float(base[3]),
        param_bytes=int(est.param_bytes), optimizer_state_bytes=int(est.state_bytes),
        activation_bytes=int(est.activation_bytes), flops_per_step=est.flops, kernels_per_step=int(est.kernels),
        gpu_seconds_per_step=math.exp(feats[FEATURES.index("log_t_gpu")]),
        host_seconds_per_step=math.exp(feats[FEATURES.index("log_t_host")]))
    return JobPrediction(
        model=model, batch=batch, precision=precision, optimizer=optimizer, gpu=gpu, host_stall_s=host_stall_s,
        host_factor=host_factor, unknown_nodes=graph.unknown_nodes, graph_nodes=len(graph.nodes), method=method,
        checkpoint=checkpoint, **bands, gpu_memory_bytes=int(spec.memory_bytes),
        fits=fits_on_gpu(bands["peak_memory_bytes"].p50, bands["device_memory_bytes"].p90, spec.memory_bytes),
        analytical=analytical, notes=notes, note_after=note_after, graph=graph, gpu_seen_in_training=seen,
        gpu_spec=spec_as_dict(spec), stack=inputs.stack.as_dict(), memory_calibration=calibration)


MAX_BATCH = 1 << 16


def largest_fitting_batch(pred: JobPrediction, est: ReplayEstimate, image: int | None = None, seq: int | None = None,
                          config_kwargs: dict | str | None = None, grad_checkpointing: bool = False,
                          stack: SoftwareStack | None = None) -> int:
    """The largest batch whose allocator peak (p50, the job's learned correction applied) plus the CUDA
    context fits the GPU (:func:`fits_on_gpu`'s "no" line); 0 where not even batch 1 does.

    The replay's peak is close to linear in the batch (weights, gradients and optimizer states fixed,
    activations per sample): a second replay gives the line, the batch where it meets the GPU's memory is
    replayed to check, and the search steps down (or up) from there, a replay a step; a few replays in all.
    """
    from dprobe.profiling.coldstart.replay import CUDA_CONTEXT_BYTES

    ratio = pred.peak_memory_bytes.p50 / max(est.peak_bytes, 1.0)  # the learned correction at this batch
    budget = (pred.gpu_memory_bytes - CUDA_CONTEXT_BYTES) / ratio  # the replayed peak that still fits

    def peak(b: int) -> float:
        if b == pred.batch:
            return est.peak_bytes
        return analytical_for(pred.model, b, pred.precision, pred.optimizer, image=image, seq=seq,
                              config_kwargs=config_kwargs, grad_checkpointing=grad_checkpointing,
                              attention=stack.attention if stack else "fused", mode=pred.mode).peak_bytes

    other = pred.batch * 2 if pred.batch < 4 else pred.batch // 2
    try:
        p_other = peak(other)
    except Exception:  # noqa: BLE001 - e.g. a batch norm that refuses batch 1: no line to search along
        return 0 if est.peak_bytes > budget else pred.batch
    slope = (est.peak_bytes - p_other) / (pred.batch - other)
    if slope <= 0:
        return MAX_BATCH if est.peak_bytes <= budget else 0
    guess = int(np.clip(pred.batch + (budget - est.peak_bytes) / slope, 1, MAX_BATCH))
    fits = {pred.batch: est.peak_bytes <= budget, other: p_other <= budget}
    best = max((b for b, ok in fits.items() if ok), default=0)
    for _ in range(4):  # refine around the line's answer: each step replays one batch
        if guess in fits:
            break
        try:
            p_guess = peak(guess)
        except Exception:  # noqa: BLE001
            break
        fits[guess] = p_guess <= budget
        if fits[guess]:
            best = max(best, guess)
            nxt = guess + max(1, guess // 50)
        else:  # down by as much as the peak is over, a little more
            nxt = max(1, min(guess - 1, int(guess * budget / p_guess * 0.99)))
        if nxt in fits or nxt == guess:
            break
        guess = nxt
    return min(best, MAX_BATCH) if best else 0
