"""CUDA autocast rules, emulated above autograd so they apply to meta tensors, and attention as the stack runs it:
a fused-attention stand-in, or matrix products and a softmax where the stack has no fused kernels."""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

# torch's CUDA autocast op lists (autocast_mode.cpp), by function / method name
LOWER = {"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "linear",
         "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum", "prelu",
         "addmv", "addr", "mv", "chain_matmul", "_convolution", "convolution",
         "multi_head_attention_forward"}
FP32 = {"layer_norm", "group_norm", "nll_loss", "cross_entropy_loss", "exp", "log", "log10", "log2", "log1p",
        "expm1", "pow", "__pow__", "rsqrt", "reciprocal", "acos", "asin", "cosh", "sinh", "tan", "erfinv",
        "softplus", "norm", "cosine_similarity", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
        "binary_cross_entropy_with_logits", "logsumexp", "cdist", "dist", "renorm", "poisson_nll_loss"}
FP32_SET_DTYPE = {"softmax", "log_softmax", "sum", "cumsum", "prod", "cumprod"}


class FusedAttention(torch.autograd.Function):
    """Memory profile of flash / memory-efficient attention: saves q, k, v, out and fp32 logsumexp."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = q.new_empty((*q.shape[:-1], v.shape[-1]))
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v, _, _ = ctx.saved_tensors
        delta = q.new_empty(q.shape[:-1], dtype=torch.float32)
        dq_acc = q.new_empty(q.shape, dtype=torch.float32) if q.dtype != torch.float32 else None
        out = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        del delta, dq_acc
        return out


class AutocastEmulation(TorchFunctionMode):
    """Apply CUDA autocast casting rules (``dtype`` None: fp32, only the attention stand-in applies).

    Casts of weights (leaf tensors that require grad) are cached for the forward, as autocast does.
    ``attention_flops`` accumulates the forward FLOPs of fused attention calls. ``fused_attention`` False:
    ``scaled_dot_product_attention`` runs as matrix products and a softmax (:func:`unfused_attention`), as
    on a stack without fused kernels.
    """

    def __init__(self, dtype: torch.dtype | None, fused_attention: bool = True) -> None:
        super().__init__()
        self.dtype = dtype
        self.fused_attention = fused_attention
        self.cache: dict[int, torch.Tensor] = {}
        self.attention_flops = 0.0

    def __enter__(self) -> AutocastEmulation:
        import torch.nn.functional as F

        self._saved_sdpa = F.scaled_dot_product_attention
        # functions that call attention internally (e.g. multi-head attention) look it up as a module global
        F.scaled_dot_product_attention = lambda *a, **k: self._attention(a, k)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        import torch.nn.functional as F

        F.scaled_dot_product_attention = self._saved_sdpa
        super().__exit__(*exc)

    def _cast(self, value: Any, dtype: torch.dtype) -> Any:
        def cast(t: Any) -> Any:
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dtype == dtype:
                return t
            # a weight: a leaf that requires grad and is no view (a view of one taken without grad, e.g. in a
            # custom autograd Function's forward, is a leaf too, but a short-lived one whose id is reused)
            if t.is_leaf and t.requires_grad and not t._is_view() and dtype == self.dtype:
                key = id(t)
                if key not in self.cache:
                    self.cache[key] = t.to(dtype)
                return self.cache[key]
            return t.to(dtype)

        return tree_map(cast, value)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "scaled_dot_product_attention":
            return self._attention(args, kwargs)
        if name == "dropout" and args and isinstance(args[0], torch.Tensor):
            return self._dropout(*args, **kwargs)
        if self.dtype is not None:
            if name in LOWER:
                args, kwargs = self._cast((args, kwargs), self.dtype)
            elif name in FP32:
                args, kwargs = self._cast((args, kwargs), torch.float32)
            elif name in FP32_SET_DTYPE and "dtype" not in kwargs and args and isinstance(args[0], torch.Tensor) \
                    and args[0].dtype in (torch.bfloat16, torch.float16):
                kwargs = {**kwargs, "dtype": torch.float32}
        return func(*args, **kwargs)

    @staticmethod
    def _dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
        """CUDA's fused dropout keeps a 1-byte mask (the generic path keeps a full-width noise tensor)."""
        if not training or p <= 0.0 or x.numel() == 0:
            return x
        if p >= 1.0:
            return x * 0.0
        return torch.native_dropout(x, p, True)[0]

    def _attention(self, args: tuple, kwargs: dict) -> torch.Tensor:
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
        call = {**dict(zip(names, args, strict=False)), **kwargs}
        q, k, v = call["query"], call["key"], call["value"]
        if self.dtype is not None:
            q, k, v = self._cast((q, k, v), self.dtype)
        if not self.fused_attention:
            with torch._C.DisableTorchFunction():  # autocast's rules applied inside, op by op
                return unfused_attention(q, k, v, call.get("attn_mask"), float(call.get("dropout_p", 0.0) or 0.0),
                                         bool(call.get("is_causal", False)), call.get("scale"),
                                         bool(call.get("enable_gqa", False)), self.dtype is not None)
        if not fused_attention_applies(q, k, v, bool(call.get("enable_gqa", False))):
            with torch._C.DisableTorchFunction():  # one aten kernel on the GPU: no autocast inside it
                return math_attention(q, k, v, call.get("attn_mask"), float(call.get("dropout_p", 0.0) or 0.0),
                                      bool(call.get("is_causal", False)), call.get("scale"))
        b = q.numel() // (q.shape[-1] * q.shape[-2])
        self.attention_flops += 4.0 * b * q.shape[-2] * k.shape[-2] * q.shape[-1]
        return FusedAttention.apply(q, k, v)


def fused_attention_applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool) -> bool:
    """Whether CUDA's SDPA would pick a fused kernel (flash or memory-efficient): both need q, k and v
    of one shape outside the sequence and head dimensions, and the same number of heads unless
    ``enable_gqa``; a key and value broadcast over the heads (multi-query attention passed as is)
    fall back to the math kernel."""
    if q.dim() != k.dim() or k.shape != v.shape[:-1] + k.shape[-1:]:
        return False
    if q.shape[:-3] != k.shape[:-3]:
        return False
    if q.dim() >= 3 and q.shape[-3] != k.shape[-3]:
        return enable_gqa and k.shape[-3] > 0 and q.shape[-3] % k.shape[-3] == 0
    return True


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                   dropout_p: float, is_causal: bool, scale: float | None) -> torch.Tensor:
    """SDPA's math kernel as CUDA runs it: bf16 / fp16 inputs upcast to fp32 (the default, without
    ``allow_fp16_bf16_reduction_math_sdp``), the full attention matrix materialised and kept for backward."""
    dtype = q.dtype
    if dtype in (torch.bfloat16, torch.float16):
        q, k, v = q.float(), k.float(), v.float()
    s = (scale if scale is not None else q.shape[-1] ** -0.5) ** 0.5
    attn = (q * s) @ (k.transpose(-2, -1) * s)
    if is_causal:
        causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        attn = attn.masked_fill(~causal, float("-inf"))
    if mask is not None:
        attn = attn.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else attn + mask
    attn = torch.softmax(attn, dim=-1)
    if dropout_p > 0:
        attn = torch.nn.functional.dropout(attn, dropout_p)
    return (attn @ v).to(dtype)


def unfused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout_p: float,
                      is_causal: bool, scale: float | None, enable_gqa: bool, autocast: bool) -> torch.Tensor:
    """Attention as matrix products and a softmax (timm's and transformers' eager paths, PyTorch's multi-head
    attention before 2.0), under autocast's rules when ``autocast``: both products in the inputs' dtype, the
    softmax in fp32 and its output cast back for the second product; the attention matrix is kept for
    backward, its dropout as a 1-byte mask."""
    if enable_gqa and q.dim() >= 3 and k.shape[-3] != q.shape[-3] and k.shape[-3] > 0:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    attn = (q * (scale if scale is not None else q.shape[-1] ** -0.5)) @ k.transpose(-2, -1)
    if is_causal:
        causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        attn = attn.masked_fill(~causal, float("-inf"))
    if mask is not None:
        attn = attn.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else attn + mask.to(attn.dtype)
    attn = torch.softmax(attn, dim=-1, dtype=torch.float32) if autocast else torch.softmax(attn, dim=-1)
    if dropout_p > 0:
        attn = torch.native_dropout(attn, dropout_p, True)[0]
    return attn.to(v.dtype) @ v
