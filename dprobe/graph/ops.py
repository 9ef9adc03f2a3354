"""Normalised op vocabulary shared by the torch and ONNX readers."""

from __future__ import annotations

import functools
import re

# order matters: first match wins
_RULES: list[tuple[str, str]] = [
    (r"^(input|placeholder)$", "input"),
    (r"^output$", "output"),
    (r"(scaled_dot_product|flash_attention|efficient_attention|multiheadattention|attention)", "attention"),
    (r"(conv_?transpose|convtranspose|deconv)", "conv_transpose"),
    (r"(^lstm|^gru|^rnn)", "linear"),  # recurrent layers: their gates are matrix products
    (r"(conv)", "conv"),
    (r"(batch_?norm|batchnormalization|instancenorm|instance_norm)", "batchnorm"),
    (r"(layer_?norm|layernormalization|rms_?norm|rmsnorm)", "layernorm"),
    (r"(group_?norm|groupnormalization|local_response|lrn|^norm|normalize)", "norm"),
    (r"(embedding|^gather$)", "embedding"),
    (r"(^linear|^gemm$|^addmm$|^dense)", "linear"),
    (r"(matmul|^mm$|^bmm$|^baddbmm$|einsum|^_scaled_mm)", "matmul"),
    (r"(cross_entropy|nll_loss|loss|log_softmax)", "loss"),
    (r"(softmax)", "softmax"),
    (r"(max_?pool|maxpool)", "maxpool"),
    (r"(avg_?pool|averagepool|adaptive|globalaveragepool|globalmaxpool|^mean$|reducemean)", "avgpool"),
    (r"(^relu|relu6|hardtanh|clip|^clamp)", "relu"),
    (r"(gelu|silu|swish|mish|hardswish|hardsigmoid|sigmoid|tanh|elu|selu|softplus|prelu|leaky|"
     r"activation|^erf$)", "activation"),
    (r"(dropout|stochastic_?depth|drop_?path|bernoulli)", "dropout"),
    (r"(^to_copy|^to$|^type_as|^cast|^float$|^half$|^bfloat16$)", "cast"),
    (r"(view|reshape|flatten|permute|transpose|squeeze|unsqueeze|expand|contiguous|^t$|^clone$|"
     r"^identity$|^alias|^detach|^as_strided|^unflatten|^narrow|^slice|^select|^getitem|^index|"
     r"^shape$|^size$|^getattr$|^pad$|^constant_pad|^tile$|^repeat|^roll$|^gathernd|^gatherelements|^scatter|^copy|"
     r"^unsafe_view|^assert|^dim$|^numel$|^len$|^sym_size|^stride$|^swapaxes|^swapdims|^moveaxis|"
     r"^movedim|^unfold|^fold$|^im2col|^col2im|pixel_?(un)?shuffle|space_?to_?depth|depth_?to_?space)", "reshape"),
    (r"(^add|^sub|^iadd|^radd|^sum$)", "add"),
    (r"(^mul|^div|^truediv|^floordiv|^pow|^sqrt|^rsqrt|^exp|^log|^neg|^reciprocal|^abs|^where|"
     r"^masked_fill|^fill|^cos|^sin|^rsub|^square|^maximum|^minimum|^lerp|^addcmul|^addcdiv|^bitwise|"
     r"^eq|^ne$|^lt|^gt|^le|^ge|^logical|^not|^and|^or|^sign|^round|^floor|^ceil|^tril|^triu|^cumsum|"
     r"^equal|^less|^greater|^mod$|^remainder|^fmod|^invert|^upsample|^interpolate|^resize|^grid_sample)",
     "elementwise"),
    (r"(^cat$|^concat|^stack|^concatenate|patch_merging)", "concat"),
    (r"(split|chunk|unbind)", "split"),
    (r"(^sum|^prod|^amax|^amin|^max$|^min$|^argmax|^argmin|^reduce|^std|^var|^any|^all|^topk|^sort)", "reduce"),
    (r"(^zeros|^ones|^full|^arange|^empty|^constant|^randn?|^rand_like|^randint|^new_|^scalar_tensor|"
     r"^lift_fresh|^range$|constantofshape)", "constant"),
]
_COMPILED = [(re.compile(p), k) for p, k in _RULES]
KINDS: list[str] = ["other", *sorted({k for _, k in _RULES})]
KIND_INDEX = {k: i for i, k in enumerate(KINDS)}

_DTYPE_SIZES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
    "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "double": 8, "float": 4, "half": 2,
}


@functools.lru_cache(maxsize=4096)
def normalise_op(name: str) -> str:
    """Map an op name (aten op, module class, function or ONNX op type) to a kind of the vocabulary."""
    parts = name.split("::")[-1].split(".")
    base = parts[1] if parts[0] in ("aten", "prims", "prim", "torch") and len(parts) > 1 else parts[-1]
    base = base.strip("_").lower()
    base = base[len("native_"):] if base.startswith("native_") else base
    base = re.sub(r"(\d)d$", "", base) if base.startswith(("conv", "batchnorm", "maxpool", "avgpool")) else base
    for pattern, kind in _COMPILED:
        if pattern.search(base):
            return kind
    return "other"


def dtype_size(dtype: str) -> int:
    return _DTYPE_SIZES.get(str(dtype).replace("torch.", ""), 4)
