"""``dprobe predict MODEL ... --colocate OTHER``: two jobs on one GPU, each predicted alone by the cold-start
profiler, then each one's slowdown beside the other and whether they fit together in memory
(:func:`dprobe.sharing.interference.predict_colocation`)."""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Callable
from typing import Any

from dprobe.sharing.interference import GPU, METHODS, MODES, FittedColocation, load_fitted, predict_colocation

RULES = {"time-share": "a rule, nothing fitted: each job keeps min(1, 1 / (u1 + u2)) of its speed",
         "contention": "contention coefficient from one co-located pair on an H200 (time-slicing), against a solo run "
                       "from another host: plausible range 0.3-1.6; MPS assumed half of it (not measured)"}


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
    g.add_argument("--colocation-model", choices=METHODS, default="auto",
                   help="the slowdown model: auto (default: the per-job model fitted on Gavel's measured pairs "
                   "where it beat the time-share rule in cross-validation, else that rule), per-job, time-share "
                   "(min(1, 1 / (u1 + u2))) or contention (the older model, one speed for both jobs)")


def uncertainty(fitted: FittedColocation | None = None) -> str:
    """What the shipped per-job model's cross-validation says of its error, in one sentence."""
    fitted = fitted or load_fitted()
    cv = (fitted.summary or {}).get("leave_model_type_out", {}).get("overall", {})
    gpu = (fitted.summary or {}).get("leave_gpu_out", {}).get("overall", {})
    if not cv:
        return "per-job model without cross-validation figures"
    return (f"per-job model fitted on Gavel's measured pairs (K80, P100, V100, time-slicing): speed MAE "
            f"{cv['per-job']:.3f} with model types held out ({gpu.get('per-job', float('nan')):.3f} with GPUs held "
            f"out), against {cv['time-share']:.3f} for the time-share rule and {cv['constant']:.3f} for the "
            "mean speed; no MPS pair was measured")


def colocate(first: dict[str, Any], second: dict[str, Any], gpu: GPU | dict[str, Any] | None = None,
             method: str = "auto", mode: str = "time-slicing", fitted: FittedColocation | None = None) -> dict[str, Any]:
    """Both jobs' speeds and slowdowns, each beside the other, and whether they fit together in memory, from
    two ``dprobe predict --json`` objects (:func:`~dprobe.sharing.interference.predict_colocation`; ``gpu``
    default: the first job's ``gpu_spec``)."""
    jobs = [first, second]
    for i, job in enumerate(jobs):
        for key in ("gpu_utilization", "device_memory_bytes", "peak_memory_bytes", "step_time_seconds"):
            if not isinstance(job.get(key), dict) or "p50" not in job[key]:
                raise ValueError(f"job {i + 1}: its prediction has no {key} p50")
    out = predict_colocation(first, second, gpu, method=method, mode=mode, fitted=fitted)
    return {
        "jobs": [{"model": j.get("model"), "batch": j.get("batch"), "gpu_utilization": u,
                  "step_time_alone_seconds": float(j["step_time_seconds"]["p50"]),
                  "step_time_colocated_seconds": float(j["step_time_seconds"]["p50"]) / s,
                  "speed": s, "slowdown": 1 - s}
                 for j, u, s in zip(jobs, out["utilization"], out["speeds"], strict=True)],
        "combined_device_memory_bytes": out["device_memory_bytes"],
        "peaks_and_contexts_bytes": out["peaks_and_contexts_bytes"],
        "gpu_memory_bytes": out["gpu_memory_bytes"],
        "fits": out["fits"],
        "sharing_mode": mode,
        "interference_model": {"method": out["method"], "why": out["why"],
                               "time_share_speed": out["time_share_speed"],
                               "uncertainty": uncertainty(fitted) if out["method"] == "per-job" else RULES[out["method"]]},
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
    out = colocate(first.as_dict(), second.as_dict(), method=getattr(args, "colocation_model", "auto"),
                   mode=args.sharing_mode)
    if args.json:
        print(json.dumps(out))
        return 0
    gib = 1 << 30
    for j in out["jobs"]:
        print(f"{j['model']} (batch {j['batch']}): utilisation {100 * j['gpu_utilization']:.0f} % alone, "
              f"predicted slowdown {100 * j['slowdown']:.1f} % beside the other "
              f"(step {1000 * j['step_time_alone_seconds']:.1f} -> {1000 * j['step_time_colocated_seconds']:.1f} ms)")
    mem = out["combined_device_memory_bytes"]
    print(f"allocator peaks and CUDA contexts {out['peaks_and_contexts_bytes'] / gib:.1f} GiB, device memory p50 "
          f"{mem['p50'] / gib:.1f} GiB, p90 {mem['p90'] / gib:.1f} GiB of {out['gpu_memory_bytes'] / gib:.1f} GiB: "
          f"fits {out['fits']} ({out['sharing_mode']})")
    model = out["interference_model"]
    print(f"slowdown by the {model['method']} model{': ' + model['why'] if model['why'] else ''}; "
          f"{model['uncertainty']}")
    return 0
