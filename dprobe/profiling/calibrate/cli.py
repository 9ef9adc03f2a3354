"""``dprobe gpu``: the GPU's own figures. ``dprobe gpu calibrate`` times this GPU (GEMM per precision and
accumulate mode, a large copy, kernel launches, convolutions, attention) in about a minute and writes a
``--gpu-spec`` file with a ``measured:`` block, which ``dprobe predict --gpu-spec`` reads.

Only argparse is imported to build the parser (``dprobe gpu --help`` stays fast); torch when it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "GPU figures: calibrate measures this GPU's throughput into a --gpu-spec file"
NO_GPU = ("{reason}; without a GPU, give dprobe predict the GPU's spec-sheet figures instead: a YAML file of "
          "name, memory_gib, fp32_tflops, fp16_tflops, bandwidth_gbps, sm_count, l2_mib, boost_clock_mhz "
          "(dprobe predict --gpu-spec FILE; docs/graph-and-coldstart.md, \"Calibrating a GPU\")")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``gpu`` and its ``calibrate`` subcommand."""
    p = subparsers.add_parser("gpu", help=HELP, description="The GPU's own figures, for dprobe predict --gpu-spec, the "
                          "sidecar's gpu_spec_files and the scaler's sharing_gpu_spec_file.")
    sub = p.add_subparsers(dest="gpu_command", metavar="SUBCOMMAND", required=True)
    c = sub.add_parser(
        "calibrate", help="time this GPU and write its --gpu-spec file (about a minute)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Time this GPU in about a minute and write its spec file for dprobe predict --gpu-spec.\n\n"
        "Measured (CUDA events, after warm-up; the best of a few sizes): GEMM FLOP/s in fp32 (TF32 off), tf32,\n"
        "fp16 and bf16 with fp32 accumulation (what autocast runs) and fp16 accumulating in fp16; a large\n"
        "device-to-device copy (bandwidth); the launch of a one-element kernel (overhead); a few convolutions\n"
        "and scaled_dot_product_attention shapes. The file has the spec sheet's fields (this GPU's entry in\n"
        "dprobe's table, --spec FILE's, or else the measured figures in their place) and a measured: block:\n"
        "the raw figures, their fractions of the spec sheet's peaks, torch and CUDA versions, the date.\n"
        "dprobe predict --mode inference puts a calibrated GPU's step on its measured peaks. The sidecar reads\n"
        "the file too (gpu_spec_files: its job predictions on this GPU), and the scaler (sharing_gpu_spec_file).",
        epilog="examples:\n  dprobe gpu calibrate --out my-gpu.yaml\n"
        "  dprobe gpu calibrate --device cuda:1 --spec sheet.yaml --seconds 30 --out my-gpu.yaml\n"
        "  dprobe predict timm:resnet50 --batch 256 --precision fp16 --mode inference --gpu-spec my-gpu.yaml --json")
    c.add_argument("--device", default="cuda", help="the CUDA device to time: cuda or cuda:N (default: cuda)")
    c.add_argument("--out", default=None, metavar="FILE",
                   help="write the spec file here (YAML; default: print it on stdout)")
    c.add_argument("--seconds", type=float, default=60.0,
                   help="time budget; measurements left when it is spent are skipped (default: 60)")
    c.add_argument("--spec", default=None, metavar="FILE",
                   help="the GPU's spec-sheet figures (a --gpu-spec file) to compare with and to keep in the file; "
                   "default: dprobe's table entry for this GPU, else the measured figures stand in")
    c.add_argument("--name", default=None, help="the GPU's name in the file (default: the device's)")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    c.set_defaults(func=run_calibrate)


def run_calibrate(args: argparse.Namespace) -> int:
    """``dprobe gpu calibrate``: check the options, open the device, time it, write the file."""
    from dprobe.core.gpus import load_gpu_spec

    if not args.device.startswith("cuda"):
        raise ValueError(f"--device {args.device!r}: a CUDA device (cuda or cuda:N); the calibration times a GPU")
    if not args.seconds > 0:
        raise ValueError(f"--seconds must be a positive number of seconds, not {args.seconds:g}")
    sheet = load_gpu_spec(args.spec) if args.spec else None
    from dprobe.profiling.calibrate.device import TorchDevice
    from dprobe.profiling.calibrate.run import calibrate, spec_document, spec_sheet_for, spec_yaml

    try:
        device = TorchDevice(args.device)
    except ValueError as exc:
        raise ValueError(NO_GPU.format(reason=exc)) from exc
    info = device.info()
    spec, source = spec_sheet_for(info, sheet)
    say = (lambda _line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    say(f"calibrating {info.name} ({args.device}; torch {info.torch}, CUDA {info.cuda or '?'}) within "
        f"{args.seconds:g} s; spec sheet: {source or 'none known (the measured figures stand in for it)'}")
    cal = calibrate(device, seconds=args.seconds, progress=say, spec=spec)
    doc = spec_document(cal, spec, args.name)
    origin = source or "nowhere (the measured figures stand in)"
    header = (f"dprobe gpu calibrate on {info.name}, {cal.date}: spec sheet from {origin}; dprobe predict "
              "--gpu-spec, the sidecar's gpu_spec_files and the scaler's sharing_gpu_spec_file read this file"
              + (f"\nskipped for the --seconds budget: {', '.join(cal.skipped)}" if cal.skipped else ""))
    text = spec_yaml(doc, header)
    if args.out:
        Path(args.out).write_text(text)
        say(f"wrote {args.out} in {cal.seconds:.0f} s")
    else:
        sys.stdout.write(text)
    return 0
