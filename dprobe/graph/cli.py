"""``dprobe graph MODEL``: write a model's portable graph (JSON)."""

from __future__ import annotations

import argparse
import json
import sys


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Arguments shared by ``dprobe graph`` and ``dprobe predict``."""
    p.add_argument("model", metavar="MODEL", help="torchvision:NAME, timm:NAME, transformers:CONFIG/ARCH, "
                   "module:pkg.mod:factory, or a path to an .onnx file")
    p.add_argument("--image", type=int, default=None, help="image side for vision models (default: the size the model is built for, "
                   "from timm's or torchvision's metadata, else 224)")
    p.add_argument("--seq", type=int, default=None,
                   help="tokens for text models (default 128, or the model's positions if fewer); audio samples "
                   "for raw-audio transformers models (default 16000)")
    p.add_argument("--config-kwargs", default=None, metavar="JSON",
                   help="JSON object of config kwargs (transformers config class, or module factory)")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("graph", help="trace a model into a portable graph (JSON)",
                              description="Trace MODEL on meta tensors (no memory, no GPU) and write its graph.")
    add_model_args(p)
    p.add_argument("--batch", type=int, default=1, help="batch size of the example inputs (default 1)")
    p.add_argument("--tracer", choices=["auto", "fx", "dispatch"], default="auto",
                   help="auto: torch.fx, falling back to dispatch-level tracing")
    p.add_argument("--out", default=None, metavar="FILE", help="output JSON file (default: stdout)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dprobe.graph import build_model_graph

    for flag in ("batch", "image", "seq"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag} must be >= 1, got {value}")
    graph = build_model_graph(args.model, batch=args.batch, image=args.image, seq=args.seq,
                              config_kwargs=args.config_kwargs, tracer=args.tracer)
    if args.out:
        graph.save(args.out)
    else:
        json.dump(graph.to_dict(), sys.stdout)
        sys.stdout.write("\n")
    s = graph.summary()
    print(f"{s['name']}: {s['nodes']} nodes ({s['unknown_nodes']} unknown), {s['edges']} edges, "
          f"{s['params']:,} params, {s['flops'] / 1e9:.2f} GFLOP forward, source {s['source']}"
          + (f" -> {args.out}" if args.out else ""), file=sys.stderr)
    if graph.meta.get("note"):
        print(f"  note: {graph.meta['note']}", file=sys.stderr)
    return 0
