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

RULES = {"time-share": "a rule, nothing fitted: each job keeps min(1, 1 / (u1 + u2)) of its speed (a job beside an "
                       "idle one at full speed; more load beside it never speeds it up)",
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
                   help="the slowdown model: auto (default: the per-job model fitted on Gavel's measured pairs for "
                   "pairs inside its support (K80 / P100 / V100 architectures, job classes and utilisations it "
                   "saw), where it beat the time-share rule on every left-out architecture and job class; the "
                   "rule elsewhere: the JSON says which ran and why), per-job, time-share (min(1, 1 / (u1 + u2))) "
                   "or contention (the older model, one speed for both jobs)")


def uncertainty(method: str, fitted: FittedColocation | None = None) -> str:
    """What validation says of ``method``'s error, in one sentence."""
    fitted = fitted or load_fitted()
    summary = fitted.summary or {}
    ratio = fitted.speed_p10_ratio.get(method, fitted.speed_p10_ratio.get("time-share", 1.0))
    interval = (f"p10 of each speed: the p50 times {ratio:.2f}, from residuals on left-out sources "
                "(docs/sharing.md lists the coverage per source)")
    if method != "per-job":
        return f"{RULES[method]}; {interval}"
    mae = {k: (summary.get(k) or {}).get("overall", {}) for k in ("leave_gpu_out", "leave_class_out")}
    if not all(mae.values()):
        return f"per-job model without validation figures; {interval}"
    return (f"per-job model fitted on Gavel's measured pairs (K80, P100, V100, time-slicing): speed MAE "
            f"{mae['leave_gpu_out']['per-job']:.3f} with each architecture left out and "
            f"{mae['leave_class_out']['per-job']:.3f} with each job class left out, against "
            f"{mae['leave_gpu_out']['time-share']:.3f} and {mae['leave_class_out']['time-share']:.3f} for the "
            f"time-share rule; {interval}")


def colocate(first: dict[str, Any], second: dict[str, Any], gpu: GPU | dict[str, Any] | None = None,
             method: str = "auto", mode: str = "time-slicing", fitted: FittedColocation | None = None) -> dict[str, Any]:
    """Both jobs' speeds (p50 and p10) and slowdowns, each beside the other, and whether they fit together
    in memory, from two ``dprobe predict --json`` objects
    (:func:`~dprobe.sharing.interference.predict_colocation`; ``gpu`` default: the first job's ``gpu_spec``)."""
    jobs = [first, second]
    for i, job in enumerate(jobs):
        for key in ("gpu_utilization", "device_memory_bytes", "peak_memory_bytes", "step_time_seconds"):
            if not isinstance(job.get(key), dict) or "p50" not in job[key]:
                raise ValueError(f"job {i + 1}: its prediction has no {key} p50")
    out = predict_colocation(first, second, gpu, method=method, mode=mode, fitted=fitted)
    return {
        "jobs": [{"model": j.get("model"), "batch": j.get("batch"), "job_class": c, "gpu_utilization": u,
                  "step_time_alone_seconds": float(j["step_time_seconds"]["p50"]),
                  "step_time_colocated_seconds": float(j["step_time_seconds"]["p50"]) / s,
                  "speed": s, "speed_p10": lo, "slowdown": 1 - s, "slowdown_p90": 1 - lo}
                 for j, c, u, s, lo in zip(jobs, out["classes"], out["utilization"], out["speeds"], out["speeds_p10"],
                                           strict=True)],
        "combined_device_memory_bytes": out["device_memory_bytes"],
        "sharing_extra_bytes": out["sharing_extra_bytes"],
        "peaks_and_contexts_bytes": out["peaks_and_contexts_bytes"],
        "gpu_memory_bytes": out["gpu_memory_bytes"],
        "fits": out["fits"],
        "sharing_mode": mode,
        "interference_model": {"method": out["method"], "why": out["why"], "support": out["support"],
                               "time_share_speed": out["time_share_speed"],
                               "uncertainty": uncertainty(out["method"], fitted)},
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
        print(f"{j['model']} (batch {j['batch']}, {j['job_class']}): utilisation {100 * j['gpu_utilization']:.0f} % "
              f"alone, predicted slowdown {100 * j['slowdown']:.1f} % beside the other (p90 "
              f"{100 * j['slowdown_p90']:.0f} %; step {1000 * j['step_time_alone_seconds']:.1f} -> "
              f"{1000 * j['step_time_colocated_seconds']:.1f} ms)")
    mem = out["combined_device_memory_bytes"]
    print(f"allocator peaks and CUDA contexts {out['peaks_and_contexts_bytes'] / gib:.1f} GiB, device memory p50 "
          f"{mem['p50'] / gib:.1f} GiB, p90 {mem['p90'] / gib:.1f} GiB of {out['gpu_memory_bytes'] / gib:.1f} GiB: "
          f"fits {out['fits']} ({out['sharing_mode']})")
    model = out["interference_model"]
    print(f"slowdown by the {model['method']} model{': ' + model['why'] if model['why'] else ''}; "
          f"{model['uncertainty']}")
    return 0
