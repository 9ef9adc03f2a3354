#!/usr/bin/env python3
"""Measure data-parallel training steps (DistributedDataParallel over NCCL) on a machine with several GPUs.

For every item of a plan (tools/plans/ddp*.json: a model spec as collect_gpu_profiles.py takes it, per-GPU
batch sizes, GPU counts) it starts ``torchrun --standalone --nproc_per_node N`` on this script's worker,
which trains the model for a few steps per batch size and records, like Pollux's measurements:

  $OUT/ddp/MODEL/placements.csv  placement (GPUs per node, one digit a node), local_bsz, step_time (s, median),
                                 sync_time (s, median: from the last local gradient to the end of the
                                 all-reduce, the part backward did not hide)
  $OUT/ddp/models.csv            model, architecture, parameters (trainable), source, backward_window (the
                                 share of backward left when a gradient byte is ready, from the model's
                                 graph traced by dprobe; empty when dprobe cannot trace it)
  $OUT/ddp/env.jsonl             one object per run: GPU, driver, CUDA, NCCL and PyTorch versions, world size

so that $OUT/ddp is laid out like datasets/pollux-placements: refit the data-parallel model on it with
``python -m dprobe.profiling.dataparallel.fit --data $OUT/ddp`` and score it with
``benchmarks/dataparallel.py --data $OUT/ddp``. Several nodes: start the worker yourself on each node with
``torchrun --nnodes M --nproc_per_node K --rdzv-endpoint HOST:PORT tools/collect_ddp_steps.py --worker ITEM``
(ITEM: one plan item as JSON with "gpus" left out); rank 0 writes the rows.

Usage: OUT=DIR python3 tools/collect_ddp_steps.py --plan tools/plans/ddp1.json [--steps 20] [--dry-run]
``--dry-run``: one CPU process over gloo, two steps, to test the plan and the output without GPUs.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WARMUP = 5


def read_plan(path: str) -> list[dict]:
    """Plan items: ``{"spec": {...}, "local_batches": [...], "gpus": [...], "precision": "fp32"}``."""
    items = json.loads(Path(path).read_text())
    if not isinstance(items, list):
        raise ValueError(f"{path}: a JSON list of items")
    for i, item in enumerate(items):
        for key in ("spec", "local_batches", "gpus"):
            if key not in item:
                raise ValueError(f"{path}: item {i} has no {key!r}")
        if not all(isinstance(b, int) and b >= 1 for b in item["local_batches"] + item["gpus"]):
            raise ValueError(f"{path}: item {i}: local_batches and gpus must be integers >= 1")
        if item.get("precision", "fp32") not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"{path}: item {i}: precision must be fp32, bf16 or fp16")
    return items


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(items: list[dict], steps: int, dry_run: bool) -> int:
    """Run every item at every GPU count this machine has; returns the number of failed runs."""
    import torch

    have = torch.cuda.device_count()
    failed = 0
    for item in items:
        for n in item["gpus"]:
            if not dry_run and n > have:
                print(f"skip {item['spec']['model']} on {n} GPUs: this machine has {have}", flush=True)
                continue
            payload = json.dumps({k: v for k, v in item.items() if k != "gpus"})
            if dry_run:  # one process, gloo on the CPU
                env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
                cmd = [sys.executable, __file__, "--worker", payload, "--steps", str(steps), "--dry-run"]
            else:
                env = dict(os.environ)
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
                       __file__, "--worker", payload, "--steps", str(steps)]
            print(f"{item['spec']['model']} on {1 if dry_run else n} GPU(s)", flush=True)
            failed += subprocess.run(cmd, env=env).returncode != 0
    return failed


def _environment(torch, device: str, world: int, local: int) -> dict:
    env = {"time": time.time(), "torch": torch.__version__, "cuda": torch.version.cuda, "device": device,
           "world_size": world, "local_world_size": local, "python": sys.version.split()[0]}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=10).stdout.split()[0]
        except (OSError, IndexError, subprocess.SubprocessError) as e:
            env["driver"] = f"unknown ({e})"
    return env


MODELS_HEADER = ["model", "architecture", "parameters", "source", "backward_window"]


def graph_spec(spec: dict) -> tuple[str, dict]:
    """The dprobe model spec of a plan item's ``spec`` and the keyword arguments of ``build_model_graph``
    that shape its inputs (image side, sequence length, config kwargs)."""
    lib, name = spec["lib"], spec["model"]
    if lib == "transformers":
        extra = {"seq": spec.get("seq"), "config_kwargs": spec.get("config_kwargs") or None}
        return f"transformers:{spec['config']}/{spec['arch']}", {k: v for k, v in extra.items() if v is not None}
    if lib in ("torchvision", "timm"):
        return f"{lib}:{name}", {"image": spec["image"]} if spec.get("image") else {}
    raise ValueError(f"model spec {spec}: lib must be torchvision, timm or transformers")


def model_window(spec: dict, batch: int) -> float | None:
    """The backward window (dprobe.profiling.dataparallel.timeline) of the model of ``spec``, traced by
    dprobe on the meta device as ``dprobe predict --gpus`` traces it; None, with a note, when it cannot."""
    try:
        from dprobe.graph.build import build_model_graph
        from dprobe.profiling.dataparallel.timeline import backward_window

        text, extra = graph_spec(spec)
        return backward_window(build_model_graph(text, batch=batch, **extra))
    except Exception as exc:  # noqa: BLE001 - a model dprobe cannot trace keeps its measured rows
        print(f"  no backward window for {spec['model']} ({type(exc).__name__}: {exc}); models.csv leaves it "
              "empty (dprobe then assumes 0.5)", flush=True)
        return None


def add_model_row(path: Path, name: str, architecture: str, params: int, window: float | None) -> bool:
    """Append ``name``'s row to the models.csv at ``path`` unless it has one already (returns whether it
    added it). The file is created with :data:`MODELS_HEADER`; one written without the ``backward_window``
    column gains it (empty for the models already there)."""
    rows: list[dict[str, str]] = []
    header = list(MODELS_HEADER)
    if path.exists():
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            header = list(reader.fieldnames or MODELS_HEADER)
        header += [column for column in MODELS_HEADER if column not in header]
        if any(row.get("model") == name for row in rows):
            return False
    rows.append({"model": name, "architecture": architecture, "parameters": str(params),
                 "source": "counted by collect_ddp_steps.py",
                 "backward_window": "" if window is None else f"{window:.3f}"})
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: row.get(k) or "" for k in header} for row in rows)
    return True


def worker(item: dict, steps: int, dry_run: bool) -> None:
    """One rank: DDP training steps at each per-GPU batch; rank 0 appends the medians."""
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(HERE))
    os.environ.setdefault("OUT", "gpu_profiles_out")
    import collect_gpu_profiles as cgp  # build_model, make_batch, forward_loss

    cuda = torch.cuda.is_available() and not dry_run
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = f"cuda:{local_rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    spec, precision = item["spec"], item.get("precision", "fp32")
    model = cgp.build_model(spec, device)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)
    last_grad: list = [None]

    def mark(_param):  # the latest local gradient of this step (all-reduce of the rest starts after it)
        if cuda:
            last_grad[0] = torch.cuda.Event(enable_timing=True)
            last_grad[0].record()
        else:
            last_grad[0] = time.perf_counter()

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(mark)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    rows = []
    for bs in item["local_batches"]:
        step_times, sync_times = [], []
        try:
            inputs, y = cgp.make_batch(spec, bs, device)
            for i in range(2 if dry_run else WARMUP + steps):
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                with torch.autocast(device.split(":")[0], dtype=dtype, enabled=dtype is not None):
                    loss = cgp.forward_loss(ddp, spec, inputs, y)
                loss.backward()  # DDP returns once every bucket is reduced
                if cuda:
                    end = torch.cuda.Event(enable_timing=True)
                    end.record()
                    end.synchronize()
                    sync = last_grad[0].elapsed_time(end) / 1e3
                else:
                    sync = time.perf_counter() - last_grad[0]
                opt.step()
                if cuda:
                    torch.cuda.synchronize()
                if dry_run or i >= WARMUP:
                    step_times.append(time.perf_counter() - t0)
                    sync_times.append(sync)
        except torch.OutOfMemoryError:
            if rank == 0:
                print(f"  batch {bs}: out of memory, skipped", flush=True)
            torch.cuda.empty_cache()
            break
        rows.append((bs, statistics.median(step_times), statistics.median(sync_times)))
    if rank == 0:
        out = Path(os.environ["OUT"]) / "ddp"
        name = spec.get("name", spec["model"])
        (out / name).mkdir(parents=True, exist_ok=True)
        placement = str(local) * (world // local) if world % local == 0 else str(world)
        path = out / name / "placements.csv"
        new = not path.exists()
        with path.open("a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(["placement", "local_bsz", "step_time", "sync_time"])
            for bs, step, sync in rows:
                w.writerow([placement, bs, f"{step:.6g}", f"{sync:.6g}"])
        models = out / "models.csv"
        if not _has_model(models, name):  # traced once per model, not once per GPU count
            window = model_window(spec, min(item["local_batches"]))
            add_model_row(models, name, f"{spec['lib']}:{spec['model']}", params, window)
        with (out / "env.jsonl").open("a") as f:
            f.write(json.dumps({**_environment(torch, "cuda" if cuda else "cpu", world, local), "model": name,
                                "precision": precision, "placement": placement}) + "\n")
        print(f"  {name} placement {placement}: " + ", ".join(f"bs {b}: {s * 1e3:.1f} ms (sync {c * 1e3:.1f})"
                                                            for b, s, c in rows), flush=True)
    dist.destroy_process_group()


def _has_model(path: Path, name: str) -> bool:
    """Whether the models.csv at ``path`` has a row for ``name``."""
    if not path.exists():
        return False
    with path.open(newline="") as f:
        return any(row.get("model") == name for row in csv.DictReader(f))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", help="JSON list of {spec, local_batches, gpus[, precision]} (tools/plans/ddp*.json)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per batch size, after 5 warm-up steps")
    ap.add_argument("--dry-run", action="store_true", help="one CPU process (gloo), two steps: test the plan")
    ap.add_argument("--worker", metavar="ITEM", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker), args.steps, args.dry_run)
        return 0
    if not args.plan:
        ap.error("--plan FILE is required")
    try:
        items = read_plan(args.plan)
    except (OSError, ValueError) as e:
        ap.error(str(e))
    return 1 if launch(items, args.steps, args.dry_run) else 0


if __name__ == "__main__":
    sys.exit(main())
