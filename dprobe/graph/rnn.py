"""Recurrent layers traced and replayed as cuDNN runs them: a few fused kernels a layer, not a few ops a step.

On meta tensors ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` fall back to PyTorch's reference implementation,
which unrolls every time step into separate ops: a replay then counts tens of thousands of kernels
(and as many host launches) where cuDNN on the GPU issues its work from C++, and takes seconds on
the CPU. :func:`fused_recurrent_layers` swaps their forward, while a graph is traced or a step
replayed, for
:class:`FusedRecurrence`, which allocates what cuDNN allocates and runs the matrix products of all
time steps as one product each:

- forward, per layer and direction: the input projection of every step (``[T·B, in] @ [in, G·H]``,
  G gates), the recurrent products (``[T·B, H] @ [H, G·H]``, one small GEMM a step on the GPU), one
  elementwise pass over the gates; kept for backward (cuDNN's reserve space): the layer's input,
  the gates, the hidden states and, for an LSTM, the cell states;
- backward: the gate gradients, then the input, recurrent and weight gradients (four products, twice
  the forward's FLOPs), the biases' gradients a sum over the steps.

Packed sequences and LSTMs with projections keep the reference path. Dropout between layers is left
out (its mask is a byte an element of each layer's output).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence

MODES = ("LSTM", "GRU", "RNN_TANH", "RNN_RELU")  # nn.RNNBase.mode of the layers swapped


class FusedRecurrence(torch.autograd.Function):
    """A multi-layer, optionally bidirectional recurrence over ``x`` ``[T, B, in]``: returns the last
    layer's hidden states ``[T, B, D·H]``, the final hidden states ``[L·D, B, H]`` and (LSTM) cells.

    For replays and graphs: its tensors have the shapes, dtypes and lifetimes of cuDNN's, and its
    products the FLOPs, but the hidden states are never computed (their values are left unset)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, h0: torch.Tensor | None, c0: torch.Tensor | None, layout: tuple,
                *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mode, hidden, layers, directions, per_cell = layout
        steps, batch = x.shape[0], x.shape[1]  # the gates (G) are in the weights' shapes: [G·H, in]
        kept, layer_in = [], x
        for layer in range(layers):
            outs = []
            for d in range(directions):
                w_ih, w_hh = weights[(layer * directions + d) * per_cell: (layer * directions + d) * per_cell + 2]
                flat_in = layer_in.reshape(steps * batch, -1)
                pre = flat_in @ w_ih.t()  # [T·B, G·H]: every step's input projection at once
                h_seq = pre.new_empty(steps, batch, hidden)
                pre = pre + h_seq.reshape(steps * batch, hidden) @ w_hh.t()  # the recurrent products
                act = torch.sigmoid(pre)  # the gates' nonlinearities, one pass
                c_seq = pre.new_empty(steps, batch, hidden) if mode == "LSTM" else None  # kept, as cuDNN does
                kept.append((flat_in, act, h_seq, c_seq, w_ih, w_hh))
                outs.append(h_seq)
                del pre
            layer_in = torch.cat(outs, dim=-1) if directions == 2 else outs[0]
        h_n = layer_in.new_empty(layers * directions, batch, hidden)
        c_n = layer_in.new_empty(layers * directions, batch, hidden) if mode == "LSTM" else layer_in.new_empty(0)
        ctx.kept, ctx.layout, ctx.x_shape, ctx.n_weights = kept, layout, x.shape, len(weights)
        ctx.initial = (h0, c0)
        return layer_in, h_n, c_n

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, grad_h: torch.Tensor, grad_c: torch.Tensor) -> tuple:
        _, hidden, layers, directions, per_cell = ctx.layout
        grads: list[torch.Tensor | None] = [None] * ctx.n_weights
        grad_in = None
        for index in reversed(range(layers * directions)):
            flat_in, act, h_seq, _, w_ih, w_hh = ctx.kept[index]
            d_gates = act * 1.0  # [T·B, G·H]: the gate gradients, one elementwise pass
            low = d_gates.dtype  # backward runs without autocast: the forward's precision, as cuDNN keeps it
            d_in = d_gates @ w_ih.to(low)  # [T·B, in]
            d_h = d_gates @ w_hh.to(low)  # [T·B, H]: the recurrent gradients, one small GEMM a step on the GPU
            base = index * per_cell
            grads[base] = d_gates.t() @ flat_in.to(low)
            grads[base + 1] = d_gates.t() @ h_seq.reshape(-1, hidden)
            if per_cell == 4:
                grads[base + 2], grads[base + 3] = d_gates.sum(0), d_gates.sum(0)
            del d_h
            if index < directions:  # first layer: the gradient of the input
                grad_in = d_in if grad_in is None else grad_in + d_in
        ctx.kept = None
        assert grad_in is not None
        h0, c0 = ctx.initial
        initial = [None if t is None else torch.empty_like(t) for t in (h0, c0)]
        return (grad_in.reshape(ctx.x_shape), *initial, None, *grads)


def _fused_forward(module: nn.RNNBase, original: Any) -> Any:
    def forward(self: nn.RNNBase, input: Any, hx: Any = None) -> Any:
        if isinstance(input, PackedSequence) or self.proj_size or input.dim() != 3:
            return original(input, hx)
        x = input.transpose(0, 1) if self.batch_first else input  # [T, B, in]
        per_cell = 4 if self.bias else 2
        layout = (self.mode, self.hidden_size, self.num_layers, 2 if self.bidirectional else 1, per_cell)
        h0, c0 = (hx if isinstance(hx, tuple) else (hx, None)) if hx is not None else (None, None)
        out, h_n, c_n = FusedRecurrence.apply(x, h0, c0, layout, *self._flat_weights)
        out = out.transpose(0, 1) if self.batch_first else out
        return out, ((h_n, c_n) if self.mode == "LSTM" else h_n)

    return types.MethodType(forward, module)


@contextlib.contextmanager
def fused_recurrent_layers(model: nn.Module) -> Iterator[int]:
    """Within the context, every ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` of ``model`` runs as
    :class:`FusedRecurrence`; yields how many layers were swapped."""
    swapped = [m for m in model.modules() if isinstance(m, nn.RNNBase) and m.mode in MODES]
    for m in swapped:
        m.forward = _fused_forward(m, m.forward)
    try:
        yield len(swapped)
    finally:
        for m in swapped:
            del m.forward  # back to the class's forward
