"""Analytical estimate: replay forward + loss + backward + optimizer step on meta tensors, tracking live bytes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dprobe.core.names import OPTIMIZERS, PRECISIONS
from dprobe.core.patch import replaced
from dprobe.graph.rnn import fused_recurrent_layers
from dprobe.graph.schema import GraphError
from dprobe.graph.zoo import (
    ExampleInputs,
    ModelSpec,
    build_module,
    example_inputs,
    with_values_assumed_if_needed,
)
from dprobe.profiling.coldstart.allocator import replay_reserved
from dprobe.profiling.coldstart.autocast import AutocastEmulation
from dprobe.profiling.coldstart.memtrack import (
    BACKWARD,
    FORWARD,
    OPTIMIZER,
    MemoryTracker,
    ReplayOp,
    round_alloc,
)

# each of PRECISIONS -> autocast dtype (None: off); the weights stay fp32 except where WEIGHT_DTYPES says otherwise
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16, "bf16-pure": torch.bfloat16}
# model.to(dtype) before training: weights, gradients and optimizer states in that dtype
WEIGHT_DTYPES = {"bf16-pure": torch.bfloat16}
TWO_STATE_OPTIMIZERS = ("adamw", "adam")  # Adam's moments: what the learned models' "adamw" feature marks
SMALL_LIMIT = 1 << 20  # allocations above 1 MiB come from the allocator's large pool
STEPS = 2  # more steps change nothing: the allocator's segments are settled after the second
CUDA_CONTEXT_BYTES = int(1.37 * (1 << 30))  # NVML used - allocator reserved, h200-profiles collection 2


@dataclass
class ReplayEstimate:
    """What one steady-state training step allocates and computes (from the meta replay)."""

    peak_bytes: float
    reserved_bytes: float
    device_bytes: float
    param_bytes: float
    state_bytes: float
    steady_bytes: float
    activation_bytes: float
    flops: float
    matmul_flops: float
    bytes_moved: float
    kernels: float
    large_allocs: float
    attention_flops: float = 0.0  # forward FLOPs of fused attention (its kernels are not dispatched on meta)
    values_assumed: float = 0.0  # 1: the forward read tensor values, replayed with masks and labels all valid
    forward_only: float = 0.0  # 1: an inference step (eval mode, no autograd), 0: a training step
    ops: list[ReplayOp] = field(default_factory=list, repr=False)  # per kernel of the measured step

    def to_dict(self) -> dict[str, Any]:
        """The estimate as JSON takes it (each op a list of five numbers)."""
        d = asdict(self)
        return {k: (v if k == "ops" else float(v)) for k, v in d.items()}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ReplayEstimate:
        """The estimate :meth:`to_dict` wrote."""
        return ReplayEstimate(**{**d, "ops": [ReplayOp(*op) for op in d.get("ops", [])]})


def _loss(model_out: Any, ex: ExampleInputs) -> torch.Tensor:
    if ex.loss == "output":
        return model_out.loss
    if isinstance(model_out, Mapping):  # e.g. torchvision segmentation: {"out": [B, C, H, W]}
        model_out = model_out.get("out", next(iter(model_out.values())))
    logits = model_out if isinstance(model_out, torch.Tensor) else model_out[0]
    if ex.loss == "ce" and logits.dim() in (2, 4):  # [B, C] classes, or [B, C, H, W] a class per pixel
        target = torch.randint(0, logits.shape[1], (logits.shape[0], *logits.shape[2:]), device=logits.device)
        return F.cross_entropy(logits, target)
    return logits.float().mean()


def _floating_to(value: Any, dtype: torch.dtype) -> Any:
    """A floating-point tensor in ``dtype``; token ids, labels and non-tensors as they are."""
    return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def make_optimizer(model: nn.Module, name: str) -> torch.optim.Optimizer:
    """The optimizer of h200-profiles' runs: AdamW(lr=1e-4) or SGD(lr=0.01, momentum=0.9), foreach; or
    Adam, which keeps AdamW's two states per parameter."""
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, foreach=True)
    raise ValueError(f"unknown optimizer {name!r} ({', '.join(OPTIMIZERS)})")


def _check_replay(precision: str, attention: str) -> bool:
    """Whether attention is fused; a ValueError for an unknown precision or attention."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} ({', '.join(PRECISIONS)})")
    if attention not in ("fused", "unfused"):
        raise ValueError(f"unknown attention {attention!r} (fused, unfused)")
    return attention == "fused"


def replay_training_step(spec: ModelSpec, batch: int, precision: str = "fp32", optimizer: str = "adamw",
                         image: int | None = None, seq: int | None = None,
                         grad_checkpointing: bool = False, attention: str = "fused",
                         channels_last: bool = False) -> ReplayEstimate:
    """Run two training steps on meta tensors and measure the second (optimizer states exist by then).

    ``grad_checkpointing``: with the model's activation checkpointing on (``transformers`` and timm; see
    :func:`enable_grad_checkpointing`): its blocks keep their inputs only and run their forward again
    in backward. ``attention``: ``fused`` (the kernel CUDA's ``scaled_dot_product_attention`` picks) or
    ``unfused`` (matrix products and a softmax: timm's own switch off, every other caller of
    ``scaled_dot_product_attention`` as an eager implementation computes it), as a stack before PyTorch
    2.0 ran attention. ``channels_last``: the model and its image inputs in ``torch.channels_last``
    (:func:`to_channels_last`)."""
    fused = _check_replay(precision, attention)
    # e.g. BART reads its mask's values, DeBERTa-v2 its labels', which meta tensors cannot answer
    with timm_fused_attention(fused, spec):
        est, retried = with_values_assumed_if_needed(
            spec, lambda: _replay(spec, batch, precision, optimizer, image, seq, grad_checkpointing, fused,
                                  channels_last))
    est.values_assumed = float(retried)
    return est


@contextlib.contextmanager
def timm_fused_attention(fused: bool, spec: ModelSpec | None = None) -> Iterator[None]:
    """timm's attention switch (``timm.layers.set_fused_attn``) set to ``fused`` for as long as it lasts; not
    touched (nor timm imported, seconds) for a torchvision or transformers model, which never reads it."""
    if spec is not None and spec.lib in ("torchvision", "transformers"):
        yield
        return
    try:
        from timm.layers import set_fused_attn, use_fused_attn
    except ImportError:
        yield
        return
    was = use_fused_attn()
    set_fused_attn(fused)
    try:
        yield
    finally:
        set_fused_attn(was)


def enable_grad_checkpointing(model: nn.Module, spec: ModelSpec,
                              context_fn: Callable[[], tuple]) -> contextlib.AbstractContextManager:
    """Turn on a model's activation checkpointing by its library's switch, non-reentrant, with
    ``context_fn`` giving the contexts of the forward and of its recomputation in backward (autocast's
    emulation must be re-entered there: the autograd engine runs with no torch-function mode).

    ``transformers`` (``activation_checkpointing_enable``, formerly ``gradient_checkpointing_enable``)
    takes the checkpoint's arguments; timm (``set_grad_checkpointing``) looks
    ``torch.utils.checkpoint.checkpoint`` up at each call, so the returned context, entered around the
    training steps, gives it them."""
    kwargs = {"use_reentrant": False, "context_fn": context_fn}
    library_model: Any = model  # the switches below are transformers' and timm's methods, not nn.Module's
    if getattr(model, "supports_gradient_checkpointing", False):
        if callable(getattr(model, "activation_checkpointing_enable", None)):  # its name since transformers 5.x
            library_model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            library_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return contextlib.nullcontext()
    if callable(getattr(model, "set_grad_checkpointing", None)):
        try:
            library_model.set_grad_checkpointing(True)
        except (AssertionError, NotImplementedError) as exc:
            raise GraphError(f"{spec.text}: timm has no gradient checkpointing for it ({exc})") from exc
        return _checkpoint_arguments(kwargs)
    raise GraphError(f"{spec.text}: gradient checkpointing is replayed for transformers and timm models that "
                     "support it (gradient_checkpointing_enable, set_grad_checkpointing)")


@contextlib.contextmanager
def _checkpoint_arguments(kwargs: dict) -> Iterator[None]:
    """``torch.utils.checkpoint.checkpoint`` called with ``kwargs`` in place of its caller's choices."""
    import torch.utils.checkpoint as ckpt

    original = ckpt.checkpoint

    def checkpoint(function: Callable, *args: Any, **given: Any) -> Any:
        return original(function, *args, **{**given, **kwargs})

    with replaced(ckpt, "checkpoint", checkpoint):
        yield


def _replay(spec: ModelSpec, batch: int, precision: str, optimizer: str, image: int | None,
            seq: int | None, grad_checkpointing: bool = False, fused: bool = True,
            channels_last: bool = False) -> ReplayEstimate:
    model = build_module(spec)
    config = getattr(model, "config", None)
    # wav2vec2, HuBERT, ...: random masks of the audio features, drawn on the host; they change no tensor's size
    if config is not None and getattr(config, "apply_spec_augment", False):
        config.apply_spec_augment = False
    recomputed: list[AutocastEmulation] = []  # one emulation per block recomputed in backward
    checkpointing: contextlib.AbstractContextManager = contextlib.nullcontext()
    if grad_checkpointing:
        def contexts() -> tuple:
            recomputed.append(AutocastEmulation(AUTOCAST_DTYPES[precision], fused))
            return contextlib.nullcontext(), recomputed[-1]

        checkpointing = enable_grad_checkpointing(model, spec, contexts)
    ex = example_inputs(spec, model, batch, image=image, seq=seq, labels=True)
    if channels_last:
        model, ex = to_channels_last(model, ex)
    if precision in WEIGHT_DTYPES:  # the model and its floating inputs in that dtype, as model.to(dtype) leaves them
        dtype = WEIGHT_DTYPES[precision]
        model.to(dtype)
        ex = ExampleInputs(tuple(_floating_to(a, dtype) for a in ex.args),
                           {k: _floating_to(v, dtype) for k, v in ex.kwargs.items()}, ex.loss, ex.meta)
    opt = make_optimizer(model, optimizer)
    tracker = MemoryTracker()
    for t in [*model.parameters(), *model.buffers(), *ex.args, *ex.kwargs.values()]:
        if isinstance(t, torch.Tensor):
            tracker.track(t)
    param_bytes = float(tracker.current)
    activation = state = steady = 0.0
    with tracker, checkpointing, fused_recurrent_layers(model):
        for step in range(STEPS):
            opt.zero_grad(set_to_none=True)
            if step == STEPS - 1:
                steady = float(tracker.current)
                state = steady - param_bytes
                tracker.reset_peak()
            emul = AutocastEmulation(AUTOCAST_DTYPES[precision], fused)
            tracker.phase = FORWARD
            with emul:
                loss = _loss(model(*ex.args, **ex.kwargs), ex)
            emul.cache.clear()
            activation = float(tracker.current) - steady
            tracker.phase = BACKWARD
            recomputed.clear()
            loss.backward()
            tracker.phase = OPTIMIZER
            opt.step()
            del loss
    peak = float(tracker.peak)
    # fused attention: forward + backward ~ 3 forwards (its kernels do not dispatch on meta), and once more
    # for a forward that checkpointing runs again in backward
    attention = 3.0 * emul.attention_flops + sum(e.attention_flops for e in recomputed)
    flops = tracker.flops + attention
    reserved = float(replay_reserved(tracker.events)[1])
    return ReplayEstimate(
        peak_bytes=peak, reserved_bytes=reserved, device_bytes=reserved + CUDA_CONTEXT_BYTES,
        param_bytes=param_bytes, state_bytes=state, steady_bytes=steady, activation_bytes=activation,
        flops=flops, matmul_flops=tracker.matmul_flops + attention,
        bytes_moved=tracker.bytes_moved, kernels=float(tracker.kernels),
        large_allocs=float(sum(1 for s in tracker.sizes if s > SMALL_LIMIT)),
        attention_flops=float(emul.attention_flops),
        ops=[ReplayOp(*(float(v) for v in op)) for op in tracker.ops],
    )


def replay_inference_step(spec: ModelSpec, batch: int, precision: str = "fp32", image: int | None = None,
                          seq: int | None = None, attention: str = "fused", channels_last: bool = False,
                          reparameterize: bool = False) -> ReplayEstimate:
    """Replay one inference step on meta tensors: the model in eval mode, its forward under
    ``torch.no_grad()`` (each activation freed once the next op has read it), as a serving process or
    timm's inference benchmark runs it. No optimizer: ``state_bytes`` is 0 and every op is a forward op.
    ``attention`` as in :func:`replay_training_step`. ``channels_last``: the model and its image inputs in
    ``torch.channels_last`` (:func:`to_channels_last`). ``reparameterize``: the model fused for inference
    first (:func:`reparameterized`; a GraphError where it has nothing to fuse)."""
    fused = _check_replay(precision, attention)
    with timm_fused_attention(fused, spec):
        est, retried = with_values_assumed_if_needed(
            spec, lambda: _replay_forward(spec, batch, precision, image, seq, fused, channels_last, reparameterize))
    est.values_assumed = float(retried)
    return est


def _replay_forward(spec: ModelSpec, batch: int, precision: str, image: int | None, seq: int | None,
                    fused: bool, channels_last: bool = False, reparameterize: bool = False) -> ReplayEstimate:
    model = reparameterized(spec) if reparameterize else build_module(spec)
    model.eval()
    ex = example_inputs(spec, model, batch, image=image, seq=seq, labels=False)
    if channels_last:
        model, ex = to_channels_last(model, ex)
    if precision in WEIGHT_DTYPES:
        dtype = WEIGHT_DTYPES[precision]
        model.to(dtype)
        ex = ExampleInputs(tuple(_floating_to(a, dtype) for a in ex.args),
                           {k: _floating_to(v, dtype) for k, v in ex.kwargs.items()}, ex.loss, ex.meta)
    tracker = MemoryTracker()
    for t in [*model.parameters(), *model.buffers(), *ex.args, *ex.kwargs.values()]:
        if isinstance(t, torch.Tensor):
            tracker.track(t)
    steady = float(tracker.current)
    param_bytes = float(sum(p.numel() * p.element_size() for p in model.parameters()))
    emul = AutocastEmulation(AUTOCAST_DTYPES[precision], fused)
    with tracker, torch.no_grad(), fused_recurrent_layers(model):
        tracker.reset_peak()
        tracker.phase = FORWARD
        with emul:
            out = model(*ex.args, **ex.kwargs)
        del out
        emul.cache.clear()
    peak = float(tracker.peak)
    attention = float(emul.attention_flops)  # fused attention kernels do not dispatch on meta: counted once
    reserved = float(replay_reserved(tracker.events)[1])
    return ReplayEstimate(
        peak_bytes=peak, reserved_bytes=reserved, device_bytes=reserved + CUDA_CONTEXT_BYTES,
        param_bytes=param_bytes, state_bytes=0.0, steady_bytes=steady, activation_bytes=max(peak - steady, 0.0),
        flops=tracker.flops + attention, matmul_flops=tracker.matmul_flops + attention,
        bytes_moved=tracker.bytes_moved, kernels=float(tracker.kernels),
        large_allocs=float(sum(1 for s in tracker.sizes if s > SMALL_LIMIT)),
        attention_flops=attention, forward_only=1.0,
        ops=[ReplayOp(*(float(v) for v in op)) for op in tracker.ops],
    )


def to_channels_last(model: nn.Module, ex: ExampleInputs) -> tuple[nn.Module, ExampleInputs]:
    """The model and its 4-D floating inputs in ``torch.channels_last`` (NHWC), as a job that calls
    ``model.to(memory_format=torch.channels_last)`` and feeds channels-last images runs: its convolutions
    then take and give NHWC tensors, and the copies its reshapes need are recorded as kernels."""
    def cl(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
            return value.contiguous(memory_format=torch.channels_last)
        return value

    model = model.to(memory_format=torch.channels_last)
    return model, ExampleInputs(tuple(cl(a) for a in ex.args), {k: cl(v) for k, v in ex.kwargs.items()},
                                ex.loss, ex.meta)


REPARAMETERIZE_METHODS = ("fuse", "reparameterize", "switch_to_deploy")  # what timm's reparameterize_model calls


def reparameterized(spec: ModelSpec) -> nn.Module:
    """The model fused for inference, on meta: timm's ``reparameterize_model`` (each submodule's ``fuse()``,
    ``reparameterize()`` or ``switch_to_deploy()``: conv + batch-norm folding, RepVGG-style branches merged)
    for a model with such a submodule, or the model's own ``fuse()`` / ``reparameterize()``. Fusing reads
    the weights' values, so a model whose fusion cannot run on meta tensors is built on the CPU, fused and
    moved to meta. A GraphError for a model with nothing to fuse (it runs as it is)."""
    model = build_module(spec)
    if not any(hasattr(m, n) for m in model.modules() for n in REPARAMETERIZE_METHODS):
        raise GraphError(f"{spec.text}: nothing to re-parameterise (no submodule has fuse, reparameterize or "
                         "switch_to_deploy); leave --reparameterize out, the model runs as it is")
    for device in ("meta", "cpu"):
        try:
            built = model if device == "meta" else build_module(spec, device="cpu")
            return _fuse(built.eval()).to("meta")
        except (NotImplementedError, RuntimeError):
            if device == "cpu":
                raise
    raise AssertionError("unreachable")


def _fuse(model: nn.Module) -> nn.Module:
    """``model`` fused in place: timm's ``reparameterize_model`` where timm is installed, else each
    submodule's method as it does."""
    try:
        from timm.models._manipulate import reparameterize_model
    except ImportError:
        pass
    else:
        return reparameterize_model(model, inplace=True)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            fuse, reparam = getattr(child, "fuse", None), getattr(child, "reparameterize", None)
            deploy = getattr(child, "switch_to_deploy", None)
            if callable(fuse):
                setattr(parent, name, fuse())
            elif callable(reparam):
                reparam()
            elif callable(deploy):
                deploy()
    return model


__all__ = ["CUDA_CONTEXT_BYTES", "ReplayEstimate", "reparameterized", "replay_inference_step", "replay_training_step", "round_alloc",
           "to_channels_last"]
