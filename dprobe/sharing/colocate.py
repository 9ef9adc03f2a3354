"""``dprobe predict MODEL ... --colocate OTHER``: two jobs on one GPU, each predicted alone by the cold-start
profiler, then their slowdowns (:mod:`dprobe.sharing.interference`), their combined memory and whether they
fit together."""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Callable
from typing import Any

from dprobe.sharing.interference import MODES, InterferenceModel

UNCERTAINTY = ("contention coefficient from one co-located pair on an H200 (time-slicing), against a solo run "
               "from another host: plausible range 0.3-1.6; MPS assumed half of it (not measured)")


def add_colocate_args(p: argparse.ArgumentParser) -> None:
    """``--colocate OTHER`` and the other job's options."""
    g = p.add_argument_group("co-location (--colocate)")
    g.add_argument("--colocate", metavar="OTHER", default=None,
                   help="a second job (same forms as MODEL) sharing the GPU: prints both jobs' predicted "
                   "slowdown, their combined memory and whether they fit together")
    g.add_argument("--colocate-batch", type=int, default=None, metavar="N",
                   help="the other job's batch (default: --batch)")
    g.add_argument("--colocate-image", type=int, default=None, metavar="N", help="the other job's --image")
    g.add_argument("--colocate-seq", type=int, default=None, metavar="N", help="the other job's --seq")
    g.add_argument("--sharing-mode", choices=MODES, default="time-slicing",
                   help="how the GPU is shared: time-slicing (default) or MPS")


def colocate(first: dict[str, Any], second: dict[str, Any], gpu_memory_bytes: float,
             model: InterferenceModel | None = None) -> dict[str, Any]:
    """Both jobs' speeds and slowdowns from their predicted utilisation (p50), their combined device memory
    (p50 and p90 summed) against ``gpu_memory_bytes``, from two ``dprobe predict --json`` objects."""
    import numpy as np

    model = model or InterferenceModel()
    jobs = [first, second]
    for i, job in enumerate(jobs):
        for key in ("gpu_utilization", "device_memory_bytes", "step_time_seconds"):
            if not isinstance(job.get(key), dict) or "p50" not in job[key]:
                raise ValueError(f"job {i + 1}: its prediction has no {key} p50")
    util = np.clip([float(j["gpu_utilization"]["p50"]) for j in jobs], 0.0, 1.0)
    speeds = model.speeds(util)
    memory = {q: float(sum(j["device_memory_bytes"].get(q, j["device_memory_bytes"]["p50"]) for j in jobs))
              for q in ("p50", "p90")}
    fits = "yes" if memory["p90"] <= gpu_memory_bytes else "maybe" if memory["p50"] <= gpu_memory_bytes else "no"
    return {
        "jobs": [{"model": j.get("model"), "batch": j.get("batch"), "gpu_utilization": float(u),
                  "step_time_alone_seconds": float(j["step_time_seconds"]["p50"]),
                  "step_time_colocated_seconds": float(j["step_time_seconds"]["p50"]) / float(s),
                  "speed": float(s), "slowdown": float(1 - s)}
                 for j, u, s in zip(jobs, util, speeds, strict=True)],
        "combined_device_memory_bytes": memory,
        "gpu_memory_bytes": float(gpu_memory_bytes),
        "fits": fits,
        "sharing_mode": model.mode,
        "interference_model": {"contention": model.effective_contention,
                               "memory_contention": model.memory_contention, "uncertainty": UNCERTAINTY},
    }


def run_colocate(args: argparse.Namespace, predict: Callable[[argparse.Namespace], Any]) -> int:
    """Predict MODEL and OTHER with ``predict`` (``dprobe predict``'s, for parsed arguments) and print."""
    if getattr(args, "samples", None):
        raise ValueError("--colocate predicts both jobs before they run; leave out --samples")
    other = copy.copy(args)
    other.model = args.colocate
    other.batch = args.colocate_batch or args.batch
    other.image, other.seq, other.config_kwargs = args.colocate_image, args.colocate_seq, None
    if other.batch < 1:
        raise ValueError(f"--colocate-batch must be >= 1, got {other.batch}")
    first, second = predict(args), predict(other)
    out = colocate(first.as_dict(), second.as_dict(), float(first.gpu_memory_bytes),
                   InterferenceModel(mode=args.sharing_mode))
    if args.json:
        print(json.dumps(out))
        return 0
    gib = 1 << 30
    for j in out["jobs"]:
        print(f"{j['model']} (batch {j['batch']}): utilisation {100 * j['gpu_utilization']:.0f} % alone, "
              f"predicted slowdown {100 * j['slowdown']:.1f} % beside the other "
              f"(step {1000 * j['step_time_alone_seconds']:.1f} -> {1000 * j['step_time_colocated_seconds']:.1f} ms)")
    mem = out["combined_device_memory_bytes"]
    print(f"combined device memory p50 {mem['p50'] / gib:.1f} GiB, p90 {mem['p90'] / gib:.1f} GiB of "
          f"{out['gpu_memory_bytes'] / gib:.1f} GiB: fits {out['fits']} ({out['sharing_mode']})")
    print(f"model: {UNCERTAINTY}")
    return 0
