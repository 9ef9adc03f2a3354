"""``dprobe predict MODEL``: cold-start prediction of a training job's memory, utilisation and step time, and
with ``--samples`` where a started job is heading (job scale)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dprobe.profiling.coldstart.predict import JobPrediction


def register(subparsers: argparse._SubParsersAction) -> None:
    from dprobe.core.gpus import GPUS
    from dprobe.core.names import OPTIMIZERS, PRECISIONS
    from dprobe.graph.cli import add_model_args
    from dprobe.profiling.coldstart.stack import add_stack_args

    p = subparsers.add_parser("predict", help="cold-start prediction of a training job from its model",
                              description="Predict the training peak of the PyTorch allocator, device memory "
                              "(NVML), GPU utilisation and step time, each p50 and p90, from MODEL alone; with --samples, "
                              "once the job has started, also where its memory and utilisation are heading over "
                              "the next 10 s.")
    add_model_args(p)
    p.add_argument("--batch", type=int, required=True, help="batch size (of a training step, or --mode inference's "
                   "forward pass)")
    p.add_argument("--mode", choices=("train", "inference"), default="train",
                   help="train: a training step (forward, backward, optimizer step); inference: one forward pass "
                   "in eval mode under torch.no_grad(), as a serving process runs a batch: memory and step time "
                   "of serving (no --optimizer, --grad-checkpointing, --samples or --gpus) (default train)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp32; bf16 or fp16 autocast, weights in fp32; bf16-pure: the model in bf16 "
                   "(model.to(torch.bfloat16): weights, gradients and optimizer states) with bf16 autocast "
                   "(default fp32)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                   help="adamw and adam keep two states per parameter, sgd (with momentum) one (default adamw; "
                   "not with --mode inference)")
    p.add_argument("--grad-checkpointing", action="store_true",
                   help="the job turns on gradient (activation) checkpointing of a transformers or timm model "
                   "(gradient_checkpointing_enable(), set_grad_checkpointing()): blocks keep their inputs only "
                   "and recompute in backward")
    p.add_argument("--checkpoint", default=None, metavar="CKPT",
                   help="cold-start checkpoint (default: the one shipped with dprobe)")
    p.add_argument("--gpu", choices=list(GPUS), default="h200",
                   help="the GPU: its memory, peak FLOP/s per precision, bandwidth, SMs, L2 and clock from the "
                   "data sheets; the output says when the checkpoint never saw a run on it "
                   "(gpu_seen_in_training; the shipped one learnt from H200 and RTX 3090 runs; default h200)")
    p.add_argument("--gpu-spec", default=None, metavar="FILE",
                   help="any other GPU, as a YAML or JSON file: name, memory_gib, fp32_tflops, fp16_tflops "
                   "(tensor, dense), bandwidth_gbps, sm_count, l2_mib, boost_clock_mhz, and optionally "
                   "tf32_tflops and bf16_tflops (default: fp32's); replaces --gpu")
    add_stack_args(p)  # --stack, --cudnn-benchmark, --attention, --memory-format, --torch
    p.add_argument("--reparameterize", action="store_true",
                   help="--mode inference: the model fused for inference first (timm's reparameterize_model, or "
                   "the model's own fuse/reparameterize: RepVGG-style branches and batch norms folded into "
                   "convolutions); refused for a model with nothing to fuse")
    p.add_argument("--compile", action="store_true",
                   help="--mode inference: the model runs under torch.compile (default mode); its kernels cannot "
                   "be replayed on the CPU, so the step is the eager prediction times a calibrated factor with "
                   "a wider p90 (method and note say so)")
    p.add_argument("--host-stall", type=float, default=0.0, metavar="SECONDS",
                   help="seconds per step, on average, the GPU waits on the host: data loading, evaluation, "
                   "checkpointing (e.g. 0.25 s every 25 steps = 0.01); lowers utilisation (default 0)")
    p.add_argument("--host-factor", type=float, default=1.0, metavar="X",
                   help="how slowly this machine's host (CPU, Python, driver) issues GPU ops against the "
                   "typical machine the checkpoint learnt from: a host-bound job's measured step time there "
                   "divided by this prediction of it at 1 (default 1); moves step time and utilisation")
    p.add_argument("--samples", default=None, metavar="CSV",
                   help="the job's GPU samples since it started, one every ~0.1 s: nvidia-smi's CSV of "
                   "timestamp, utilization.gpu, memory.used and memory.total (nvidia-smi --query-gpu=... "
                   "--format=csv -lms 100), or dprobe's samples.csv columns; adds where its memory and "
                   "utilisation are heading over the next 10 s, from its first second (job_scale)")
    p.add_argument("--jobscale-checkpoint", default=None, metavar="CKPT",
                   help="job-scale checkpoint for --samples (default: the one shipped with dprobe; "
                   "train.py writes jobscale/jobscale.pt)")
    p.add_argument("--search-batch", action="store_true",
                   help="also find the largest batch predicted to fit the GPU (largest_batch: 2-5 more replays, "
                   "seconds; without it largest_batch is null)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    from dprobe.profiling.dataparallel.cli import add_data_parallel_args  # --gpus, --nodes, --placement ...

    add_data_parallel_args(p)
    from dprobe.sharing.colocate import add_colocate_args  # --colocate OTHER: dprobe.sharing.colocate

    add_colocate_args(p)
    p.set_defaults(func=run)


def predict_from_args(args: argparse.Namespace) -> JobPrediction:
    """The prediction ``dprobe predict`` prints, for its parsed arguments."""
    from dprobe.data.gpu_samples import read_gpu_samples
    from dprobe.profiling.coldstart.stack import stack_choice
    from dprobe.profiling.predict import predict_with_samples

    mode = getattr(args, "mode", "train")
    if mode == "inference" and args.optimizer is not None:
        raise ValueError("--optimizer is a training setting: leave it out with --mode inference")
    if mode == "inference" and args.samples:
        raise ValueError("--samples forecasts a started training job (the job-scale model learnt from training "
                         "runs); leave it out with --mode inference")
    optimizer = args.optimizer or "adamw"
    samples = read_gpu_samples(args.samples) if args.samples else None
    return predict_with_samples(args.model, args.batch, samples=samples, jobscale_checkpoint=args.jobscale_checkpoint,
                                precision=args.precision, optimizer=optimizer, image=args.image, seq=args.seq, mode=mode,
                                config_kwargs=args.config_kwargs, checkpoint=args.checkpoint, gpu=_gpu(args),
                                host_stall_s=args.host_stall, host_factor=args.host_factor,
                                grad_checkpointing=args.grad_checkpointing,
                                search_batch=getattr(args, "search_batch", False),
                                stack=stack_choice(args), **_settings(args))


def _settings(args: argparse.Namespace) -> dict[str, bool]:
    """``--reparameterize`` and ``--compile`` where given (predict_job's ``reparameterize``, ``compiled``)."""
    return {k: True for k, flag in (("reparameterize", "reparameterize"), ("compiled", "compile"))
            if getattr(args, flag, False)}


def _gpu(args: argparse.Namespace) -> object:
    """``--gpu``'s key, or the spec ``--gpu-spec`` reads (its errors name the file and field)."""
    from dprobe.core.gpus import load_gpu_spec

    if args.gpu_spec and args.gpu != "h200":
        raise ValueError("give --gpu or --gpu-spec, not both")
    return load_gpu_spec(args.gpu_spec) if args.gpu_spec else args.gpu


def run(args: argparse.Namespace) -> int:
    # data parallel (--gpus): dprobe.profiling.dataparallel.cli prints it
    from dprobe.profiling.dataparallel.cli import refuse_without_gpus, run_data_parallel
    from dprobe.profiling.predict import StartedJobPrediction

    refuse_without_gpus(args)
    if getattr(args, "mode", "train") == "inference" and (getattr(args, "gpus", None) is not None
                                                           or getattr(args, "colocate", None)):
        raise ValueError("--gpus and --colocate predict training jobs: leave them out with --mode inference")
    if getattr(args, "colocate", None):  # two jobs on one GPU: dprobe.sharing.colocate
        from dprobe.sharing.colocate import run_colocate

        return run_colocate(args, predict_from_args)
    if getattr(args, "gpus", None) is not None:
        return run_data_parallel(args, predict_from_args)
    p = predict_from_args(args)
    if args.json:
        print(json.dumps(p.as_dict()))
        return 0
    gib = 1 << 30
    stall = f", host stall {1000 * args.host_stall:g} ms a step" if args.host_stall else ""
    stall += f", host factor {args.host_factor:g}" if args.host_factor != 1.0 else ""
    what = "inference (forward, eval)" if p.mode == "inference" else p.optimizer
    print(f"{args.model} batch {args.batch} {args.precision} {what} on {p.gpu}{stall} ({p.method})")
    if p.stack:
        st = p.stack
        print(f"  software stack  {st['preset']}{' + ' + ', '.join(st['overrides']) if st['overrides'] else ''}: "
              f"torch {st['torch']}, cudnn.benchmark {'on' if st['cudnn_benchmark'] else 'off'}, "
              f"{st['attention']} attention, {st['memory_format']}")
    print(f"  allocator peak  {p.peak_memory_bytes.p50 / gib:8.2f} GiB (p90 {p.peak_memory_bytes.p90 / gib:.2f})")
    print(f"  device memory   {p.device_memory_bytes.p50 / gib:8.2f} GiB (p90 {p.device_memory_bytes.p90 / gib:.2f})")
    print(f"  GPU utilisation {100 * p.gpu_utilization.p50:8.1f} %   (p90 {100 * p.gpu_utilization.p90:.1f})")
    print(f"  step time       {1000 * p.step_time_seconds.p50:8.1f} ms  (p90 {1000 * p.step_time_seconds.p90:.1f})")
    if p.fits != "yes":
        why = "out of memory: the allocator peak alone is more" if p.fits == "no" else "the device memory's p90 is more"
        print(f"  {'will not fit' if p.fits == 'no' else 'may not fit'} on the {p.gpu.upper()} at batch "
              f"{args.batch} ({why} than its {p.gpu_memory_bytes / gib:.1f} GiB); try a smaller --batch"
              f"{', bf16 or fp16' if p.mode == 'inference' else ', bf16 or sgd'}")
    if p.largest_batch is not None:
        print(f"  largest batch predicted to fit: {p.largest_batch}" if p.largest_batch else
              "  no batch is predicted to fit")
    if isinstance(p, StartedJobPrediction):
        js = p.job_scale
        mem, util = js.memory_plateau_bytes, js.gpu_utilization
        print(f"  next {js.horizon_seconds:g} s, from the first {js.after_seconds:g} s of samples ({js.samples_used}):")
        print(f"  memory plateau  {mem['p50'] / gib:8.2f} GiB (p90 {mem['p90'] / gib:.2f}, p99 {mem['p99'] / gib:.2f})")
        print(f"  GPU utilisation {100 * util['p50']:8.1f} %   (p90 {100 * util['p90']:.1f}, "
              f"p99 {100 * util['p99']:.1f})")
    if p.unknown_nodes:
        print(f"  note: {p.unknown_nodes} graph node(s) had unknown ops", file=sys.stderr)
    for note in filter(None, p.note.split("; ")):
        print(f"  note: {note}", file=sys.stderr)
    return 0
