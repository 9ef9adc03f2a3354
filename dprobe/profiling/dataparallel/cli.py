"""``dprobe predict MODEL --batch B --gpus N [--nodes M | --placement 1122]``: the data-parallel options of
``dprobe predict`` and what it prints with them."""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dprobe.profiling.dataparallel.placement import DEFAULT_GPUS_PER_NODE

if TYPE_CHECKING:
    from dprobe.profiling.dataparallel.interconnect import Interconnect
    from dprobe.profiling.dataparallel.placement import Placement

GRAD_BYTES = {"bf16-pure": 2}  # bytes per gradient by --precision; 4 (fp32 weights) otherwise


def add_data_parallel_args(p: argparse.ArgumentParser) -> None:
    """``dprobe predict``'s data-parallel options."""
    g = p.add_argument_group("data parallel (DistributedDataParallel, NCCL ring all-reduce)",
                             "with --gpus, --batch is the global batch, split evenly over the GPUs; the "
                             "cold-start figures are then one GPU's at the per-GPU batch, and the JSON gains a "
                             "data_parallel object")
    g.add_argument("--gpus", type=int, default=None, metavar="N", help="GPUs the job trains on")
    g.add_argument("--nodes", type=int, default=None, metavar="M",
                   help="nodes the GPUs are spread over, evenly (default: as few as hold them)")
    g.add_argument("--placement", default=None, metavar="DIGITS",
                   help="GPUs on each node, one digit a node (1122: 6 GPUs on 4 nodes; 8+8+4 for more than 9)")
    g.add_argument("--gpus-per-node", type=int, default=None, metavar="K",
                   help=f"GPUs a node holds (default {DEFAULT_GPUS_PER_NODE}); bounds --nodes and the scaling limit")
    g.add_argument("--step-time", type=float, default=None, metavar="SECONDS",
                   help="the job's measured step time on one GPU at the per-GPU batch, instead of the cold-start "
                   "estimate")
    g.add_argument("--params", type=int, default=None, metavar="N",
                   help="the model's trainable parameters (gradient size), instead of the traced graph's; with "
                   "--step-time also for a model dprobe cannot trace")
    g.add_argument("--min-efficiency", type=float, default=None, metavar="X",
                   help="report the GPUs beyond which throughput per GPU drops under X of one GPU's (default 0.8)")
    g.add_argument("--interconnect", default=None, metavar="INTRA[,INTER]",
                   help="the links the all-reduce crosses inside a node and between nodes: presets (pcie3, pcie4, "
                   "pcie5, nvlink2, nvlink3, nvlink4; ethernet-10g ... ethernet-400g, infiniband-edr, -hdr, -ndr), "
                   "numbers of Gb/s, or a measured cluster (pollux-t4, gavel-k80, gavel-p100, gavel-v100, or one you "
                   "refitted); default "
                   "per --gpu (h200: nvlink4,infiniband-ndr; t4: the measured Pollux cluster, pcie3,ethernet-50g)")
    g.add_argument("--sync-model", default=None, choices=("auto", "buckets", "baseline", "exponential"),
                   help="the gradient all-reduce's model: buckets (DDP's 25 MB buckets, each overlapped with the "
                   "backward left), baseline (the measured models' median sync per gradient byte at the placement), "
                   "exponential (the earlier smooth model); default auto: on a measured cluster the bucket model "
                   "only where it beat the baseline on every left-out model, else the baseline; on another "
                   "cluster the bucket model. The JSON's data_parallel.sync_model says which ran and why")


def _check(args: argparse.Namespace) -> tuple[Placement, Interconnect]:
    """The placement and links, before any replay; ValueErrors name the option."""
    from dprobe.profiling.dataparallel._fitted import FITTED
    from dprobe.profiling.dataparallel.interconnect import resolve_interconnect
    from dprobe.profiling.dataparallel.placement import resolve_placement

    where = resolve_placement(args.gpus, args.nodes, args.placement, args.gpus_per_node)
    gpu = None if getattr(args, "gpu_spec", None) else getattr(args, "gpu", None)
    links = resolve_interconnect(getattr(args, "interconnect", None), gpu, tuple(FITTED["clusters"]))
    if args.batch < 1 or args.batch % where.gpus:
        raise ValueError(f"--batch {args.batch} does not divide over --gpus {where.gpus}: give a global batch that "
                         f"is a multiple of the GPUs")
    if args.step_time is not None and not 0 < args.step_time < float("inf"):
        raise ValueError(f"--step-time must be a positive number of seconds, not {args.step_time}")
    if args.params is not None and args.params < 1:
        raise ValueError(f"--params must be >= 1, not {args.params}")
    return where, links


def refuse_without_gpus(args: argparse.Namespace) -> None:
    """A ValueError naming a data-parallel option given without ``--gpus``."""
    for flag in ("nodes", "placement", "gpus_per_node", "step_time", "params", "min_efficiency", "interconnect",
                 "sync_model"):
        if getattr(args, flag, None) is not None and getattr(args, "gpus", None) is None:
            raise ValueError(f"--{flag.replace('_', '-')} is read with --gpus only")


def run_data_parallel(args: argparse.Namespace, predict: Callable[[argparse.Namespace], Any]) -> int:
    """``dprobe predict`` with ``--gpus``: ``predict`` (the cold-start prediction of parsed arguments) at the
    per-GPU batch, and the data-parallel step time, throughput and scaling efficiency."""
    from dprobe.profiling.dataparallel.predict import DEFAULT_MIN_EFFICIENCY, predict_data_parallel
    from dprobe.profiling.dataparallel.timeline import backward_window

    where, links = _check(args)
    local = copy.copy(args)
    local.batch = args.batch // where.gpus
    cold, failure = None, None
    try:
        cold = predict(local)
    except ValueError as exc:  # e.g. a model dprobe cannot trace: enough with --step-time and --params
        if args.step_time is None or args.params is None:
            raise
        failure = str(exc)
    bytes_each = GRAD_BYTES.get(args.precision, 4)
    if args.params is not None:
        grad_bytes, grad_from = float(args.params * bytes_each), "--params"
    elif cold is None:  # the replay's failure is raised above unless --params and --step-time stand in
        raise ValueError(f"no cold-start prediction and no --params: {failure}")
    elif cold.graph is not None and cold.graph.num_params:
        grad_bytes, grad_from = float(cold.graph.num_params * bytes_each), "graph"
    else:
        grad_bytes, grad_from = float(cold.analytical.param_bytes), "replay"
    graph = getattr(cold, "graph", None)
    window = backward_window(graph) if graph is not None else None
    if args.step_time is not None:
        single, single_from = (args.step_time, args.step_time), "--step-time"
    elif cold is None:
        raise ValueError(f"no cold-start prediction and no --step-time: {failure}")
    else:
        single, single_from = (cold.step_time_seconds.p50, cold.step_time_seconds.p90), "cold start"
    dp = predict_data_parallel(single, grad_bytes, args.batch, where,
                               args.gpus_per_node or DEFAULT_GPUS_PER_NODE, single_from, grad_from,
                               args.min_efficiency if args.min_efficiency is not None else DEFAULT_MIN_EFFICIENCY,
                               window=window, interconnect=links,
                               sync_model=getattr(args, "sync_model", None) or "auto")
    if args.json:
        head = cold.as_dict() if cold is not None else {
            "model": args.model, "batch": local.batch, "precision": args.precision,
            "note": f"no cold-start prediction (the data-parallel figures use --step-time and --params): {failure}"}
        print(json.dumps({**head, "data_parallel": dp.as_dict()}))
        return 0
    print(f"{args.model} global batch {args.batch} on {where.gpus} GPU(s), {where.nodes} node(s) "
          f"(placement {where}), {local.batch} per GPU, {args.precision}")
    if cold is not None:
        gib = 1 << 30
        print(f"  per GPU: allocator peak {cold.peak_memory_bytes.p50 / gib:.2f} GiB (p90 "
              f"{cold.peak_memory_bytes.p90 / gib:.2f}), device memory {cold.device_memory_bytes.p50 / gib:.2f} GiB "
              f"(p90 {cold.device_memory_bytes.p90 / gib:.2f}), fits: {cold.fits}")
    else:
        print(f"  no cold-start prediction: {failure}", file=sys.stderr)
    d = dp.as_dict()
    print(f"  one GPU step      {1000 * single[0]:8.1f} ms  ({single_from})")
    print(f"  gradients         {grad_bytes / 1e6:8.1f} MB  ({grad_from})")
    print(f"  backward window   {dp.backward_window:8.2f}     ({dp.backward_window_from}: share of backward left to "
          f"hide a gradient byte; {dp.window_used:.2f} used)")
    print(f"  step time         {1000 * dp.step_time_seconds[0]:8.1f} ms  (p90 {1000 * dp.step_time_seconds[1]:.1f})")
    print(f"  of which sync     {1000 * dp.sync_time_seconds[0]:8.1f} ms  (p90 {1000 * dp.sync_time_seconds[1]:.1f})")
    print(f"  sync model        {dp.sync_model} ({dp.sync_model_why})")
    tp = d["throughput_samples_per_second"]
    print(f"  throughput        {tp['p50']:8.1f} samples/s (p90 step: {tp['p90']:.1f})")
    print(f"  scaling efficiency {100 * dp.scaling_efficiency:7.1f} %")
    limit = dp.scaling_limit_gpus
    where_to = (f"beyond {limit} GPU(s)" if limit is not None else "not up to 1024 GPUs")
    print(f"  throughput per GPU drops under {100 * dp.min_efficiency:.0f} % of one GPU's {where_to} "
          f"(nodes of {dp.gpus_per_node}, per-GPU batch {local.batch})")
    eff = d["interconnect"]["effective_bytes_per_second"]  # of ``links``, the interconnect predicted on
    calibrated = (f"fitted on the measured cluster {links.measured}" if links.measured else
                  "nominal x the efficiency measured clusters reach")
    if dp.sync_model == "baseline":
        calibrated += "; the baseline that ran uses none of them: measured sync per gradient byte"
    print(f"  links             {links.intra.name} / {links.inter.name} ({links.source}): {eff['intra'] / 1e9:.2f} / "
          f"{eff['inter'] / 1e9:.2f} GB/s reached ({calibrated})")
    return 0
