"""``dprobe.onnx``: a ``dprobe.pt`` checkpoint's network exported to ONNX, for the sidecar.

Everything in the checkpoint but the weights (tasks, point sources, quantile shifts, regimes,
short-lead exponents, split: :mod:`dprobe.forecaster.checkpoint`) travels in the model's metadata,
under the key ``dprobe`` as JSON. :class:`~dprobe.forecaster.runtime.OnnxForecaster` runs it with
ONNX Runtime, without importing torch (a fraction of the memory).
"""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import torch

from dprobe.forecaster.checkpoint import network_from_checkpoint

# the checkpoint's entries the export's metadata holds (all but the weights), in this order
METADATA_KEYS = ("kind", "format", "dprobe_version", "hparams", "tasks", "point_sources", "quantile_shifts",
                 "regimes", "workloads_trained", "workload_tasks", "short_lead_exponents", "split",
                 "graph_encoder")


def export_onnx(obj: dict, path: str | Path) -> Path:
    """Export a ``dprobe.pt`` dict's network to ONNX, with its metadata (all but the weights) inside."""
    import onnx

    net = network_from_checkpoint(obj)
    hp = obj["hparams"]
    from dprobe.forecaster.features import N_COVARIATES, N_STATS

    example: tuple[torch.Tensor, ...] = (torch.zeros(2, hp["context_length"], 2 + N_COVARIATES),
                                         torch.zeros(2, N_STATS), torch.zeros(2, dtype=torch.long))
    names = ["x", "stats", "task"]
    if hp.get("use_graph"):  # workload inputs: tokens (B, D) and known flags (B,) as 0 / 1
        from dprobe.data.workloads import workload_dim

        example = (*example, torch.zeros(2, int(hp.get("d_graph") or workload_dim())), torch.tensor([1.0, 0.0]))
        names += ["cond", "known"]
    buf = io.BytesIO()
    batch_axis = {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on its own deprecation and on index ops
        # torch annotates f as a path, but its TorchScript exporter (dynamo=False) writes to a file object too
        torch.onnx.export(net, example, buf, dynamo=False, input_names=names,  # type: ignore[arg-type]
                          output_names=["quantiles"], opset_version=17,
                          dynamic_axes={**{n: batch_axis for n in names}, "quantiles": batch_axis})
    model = onnx.load_from_string(buf.getvalue())
    meta = {k: obj[k] for k in METADATA_KEYS if k in obj}
    entry = model.metadata_props.add()
    entry.key, entry.value = "dprobe", json.dumps(meta)
    path = Path(path)
    onnx.save(model, str(path))
    return path
