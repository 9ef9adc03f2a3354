"""One entry point from a model spec to a ModelGraph."""

from __future__ import annotations

from typing import Any

import torch

from dprobe.graph.onnx_reader import read_onnx
from dprobe.graph.rnn import fused_recurrent_layers
from dprobe.graph.schema import ModelGraph
from dprobe.graph.trace import trace_module
from dprobe.graph.zoo import (
    VALUES_ASSUMED_NOTE,
    build_module,
    example_inputs,
    parse_spec,
    with_values_assumed_if_needed,
)


def build_model_graph(model: str, batch: int = 1, image: int | None = None, seq: int | None = None,
                      config_kwargs: str | dict[str, Any] | None = None, tracer: str = "auto") -> ModelGraph:
    """Graph of a model spec (zoo name, ``module:`` factory or ``.onnx`` path) for ``batch`` inputs."""
    spec = parse_spec(model, config_kwargs)
    if spec.lib == "onnx":
        graph = read_onnx(spec.name, batch=batch, seq=seq)
    else:
        module = build_module(spec)
        ex = example_inputs(spec, module, batch, image=image, seq=seq)
        with torch.enable_grad(), fused_recurrent_layers(module):  # recurrences as cuDNN runs them
            graph, retried = with_values_assumed_if_needed(
                spec, lambda: trace_module(module, ex.args, ex.kwargs, name=model, tracer=tracer))
        if retried:
            graph.meta["note"] = VALUES_ASSUMED_NOTE
        graph.meta["params_total"] = sum(p.numel() for p in module.parameters())
        graph.meta["buffer_bytes"] = sum(b.numel() * b.element_size() for b in module.buffers())
        graph.inputs.update(ex.meta)
    graph.name = model
    graph.inputs.setdefault("batch", batch)
    if spec.config_kwargs:
        graph.meta["config_kwargs"] = spec.config_kwargs
    return graph
