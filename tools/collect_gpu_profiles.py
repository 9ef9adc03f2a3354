#!/usr/bin/env python3
"""Profile real deep-learning workloads on one NVIDIA GPU.

Runs training steps of many model architectures (torchvision, transformers)
at several batch sizes and precisions, a few inference services under a
time-varying request load, and co-located training pairs, while a background
thread samples NVML.  Everything is written incrementally under $OUT:

  runs.jsonl   one object per workload run (spec, params, flops, peaks, status)
  samples.csv  NVML samples (device util, memory-controller util, used bytes,
               power, SM clock, temperature, per-process used memory)
  steps.csv    one row per training / inference step (timing, torch memory)
  env.json     GPU, driver and library versions; the host's CPU and how fast it
               launches kernels (host_benchmark_start / _end, microseconds)
  log.txt      progress and errors

Run it on a machine with an NVIDIA GPU, PyTorch, torchvision, transformers, timm
and nvidia-ml-py, with OUT naming the output folder; edit MODELS / SERVICES /
PAIRS, or give --plan FILE (a JSON list of [spec, batch sizes, precisions], as
tools/plans/*.json; a spec may fix "phases", e.g. for control runs that repeat
an earlier collection's), for what you want to measure. Test with --dry-run on the CPU first. Then add the
session to a profiles data set with `dprobe profiles add OUT --data DIR`.

Several GPUs at hand: --ddp PLAN (tools/plans/ddp1.json) measures data-parallel steps instead, with
torchrun over NCCL (tools/collect_ddp_steps.py; its output refits `dprobe predict --gpus`).

Co-located pairs: --pairs PLAN (tools/plans/pairs1.json) runs each member alone first, then each pair
as two processes on the GPU, time-slicing or under MPS ("mode"), at several utilisation levels: what
calibrates dprobe's interference model (dprobe.sharing.interference.pair_calibrations).

Usage: python3 collect_gpu_profiles.py [--budget SECONDS] [--dry-run] [--plan FILE]
       python3 collect_gpu_profiles.py --single JSON --seconds S --tag T
"""
import argparse
import csv
import gc
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
import traceback

import torch

OUT = os.environ.get("OUT", "gpu_profiles_out")
os.makedirs(OUT, exist_ok=True)
T0 = float(os.environ.get("PROFILE_T0", time.time()))
os.environ["PROFILE_T0"] = str(T0)
LOG = open(os.path.join(OUT, "log.txt"), "a", buffering=1)  # noqa: SIM115 - open for the whole session


def log(*a):
    msg = f"[{time.time() - T0:7.2f}] " + " ".join(str(x) for x in a)
    print(msg, flush=True)
    LOG.write(msg + "\n")


# ---------------------------------------------------------------- NVML sampler
class Sampler(threading.Thread):
    FIELDS = ["t", "epoch", "label", "gpu_util_pct", "mem_util_pct", "mem_used_bytes",
              "mem_total_bytes", "power_w", "sm_clock_mhz", "temp_c", "procs"]

    def __init__(self, path, period):
        super().__init__(daemon=True)
        self.period = period
        self.label = "idle"
        self.stop = threading.Event()
        self.f = open(path, "a", newline="", buffering=1)  # noqa: SIM115 - closed by the owner
        self.w = csv.writer(self.f)
        if os.path.getsize(path) == 0:
            self.w.writerow(self.FIELDS)
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nv = pynvml
            self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as e:  # no GPU: dry run
            log("NVML unavailable:", e)
            self.nv = None

    def read(self):
        nv, h = self.nv, self.h
        u = nv.nvmlDeviceGetUtilizationRates(h)
        m = nv.nvmlDeviceGetMemoryInfo(h)
        try:
            p = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        except Exception:
            p = ""
        try:
            sm = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
        except Exception:
            sm = ""
        try:
            tc = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
        except Exception:
            tc = ""
        try:
            procs = {str(pr.pid): int(pr.usedGpuMemory or 0)
                     for pr in nv.nvmlDeviceGetComputeRunningProcesses(h)}
        except Exception:
            procs = {}
        return [u.gpu, u.memory, m.used, m.total, p, sm, tc, json.dumps(procs)]

    def run(self):
        while not self.stop.is_set():
            t = time.time()
            if self.nv is not None:
                try:
                    row = self.read()
                except Exception as e:
                    row = ["", "", "", "", "", "", "", json.dumps({"error": str(e)})]
                self.w.writerow([f"{t - T0:.3f}", f"{t:.3f}", self.label] + row)
            self.stop.wait(max(0.0, self.period - (time.time() - t)))
        self.f.close()


# ---------------------------------------------------------------- workloads
def build_model(spec, device):
    lib, name = spec["lib"], spec["model"]
    with torch.device(device):
        if lib == "torchvision":
            import torchvision
            kw = {"aux_logits": False, "init_weights": False} if name == "inception_v3" else {}
            if name == "googlenet":
                kw = {"aux_logits": False, "init_weights": False}
            return torchvision.models.get_model(name, weights=None, **kw)
        if lib == "transformers":
            import transformers as tf
            cfg_cls = getattr(tf, spec["config"])
            cfg = cfg_cls(**spec.get("config_kwargs", {}))
            model_cls = getattr(tf, spec["arch"])
            m = model_cls(cfg)
            return m
        if lib == "timm":
            import timm
            return timm.create_model(name, pretrained=False)
    raise ValueError(spec)


def make_batch(spec, bs, device):
    if spec["lib"] in ("torchvision", "timm"):
        s = spec.get("image", 224)
        x = torch.randn(bs, 3, s, s, device=device)
        y = torch.randint(0, 1000, (bs,), device=device)
        return (x,), y
    L = spec["seq"]
    vocab = spec.get("vocab", 30522)
    ids = torch.randint(0, vocab, (bs, L), device=device)
    if spec["task"] == "cls":
        return {"input_ids": ids, "labels": torch.randint(0, 2, (bs,), device=device)}, None
    if spec["task"] == "seq2seq":
        return {"input_ids": ids, "labels": torch.randint(0, vocab, (bs, L // 4), device=device)}, None
    return {"input_ids": ids, "labels": ids}, None


def forward_loss(model, spec, inputs, y):
    if spec["lib"] in ("torchvision", "timm"):
        out = model(*inputs)
        if isinstance(out, tuple):
            out = out[0]
        if hasattr(out, "logits"):
            out = out.logits
        return torch.nn.functional.cross_entropy(out, y)
    return model(**inputs).loss


NO_FLOPS = False
# the image models' memory format for the whole session (--memory-format): nchw (PyTorch's default,
# contiguous) or nhwc (channels_last; timm's own benchmark differs by about 20 % between them)
MEMORY_FORMAT = "nchw"


def count_flops(model, spec, bs, device, train=True):
    if NO_FLOPS:
        return None
    try:
        from torch.utils.flop_counter import FlopCounterMode
        inputs, y = make_batch(spec, bs, device)
        fc = FlopCounterMode(display=False)
        with fc:
            if train:
                loss = forward_loss(model, spec, inputs, y)
                loss.backward()
            else:
                with torch.no_grad():
                    forward_loss(model, spec, inputs, y)
        model.zero_grad(set_to_none=True)
        return int(fc.get_total_flops())
    except Exception as e:
        log("flop count failed", spec["model"], type(e).__name__, str(e)[:120])
        return None


STEP_FIELDS = ["run_id", "step", "phase", "t_start", "t_end", "batch", "queue",
               "alloc_bytes", "reserved_bytes", "peak_alloc_bytes"]


class StepLog:
    def __init__(self, path):
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        self.f = open(path, "a", newline="", buffering=1)  # noqa: SIM115 - closed by the owner
        self.w = csv.writer(self.f)
        if new:
            self.w.writerow(STEP_FIELDS)

    def row(self, run_id, step, phase, ts, te, bs, q, cuda):
        if cuda:
            a, r, p = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved(),
                       torch.cuda.max_memory_allocated())
        else:
            a = r = p = 0
        self.w.writerow([run_id, step, phase, f"{ts - T0:.4f}", f"{te - T0:.4f}", bs, q, a, r, p])


def record_run(rec):
    with open(os.path.join(OUT, "runs.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")


def cleanup(cuda):
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def train_run(run_id, spec, bs, precision, seconds, steps, device, phases=False):
    cuda = device == "cuda"
    rec = {"run_id": run_id, "kind": "train", "batch": bs, "precision": precision,
           "seconds": seconds, "phases": phases, **spec, "pid": os.getpid(),
           "cudnn_benchmark": torch.backends.cudnn.benchmark, "memory_format": MEMORY_FORMAT}
    nhwc = MEMORY_FORMAT == "nhwc" and spec["lib"] in ("torchvision", "timm")
    rec["t_begin"] = time.time() - T0
    model = opt = None
    try:
        model = build_model(spec, device)
        if nhwc:
            model = model.to(memory_format=torch.channels_last)
        model.train()
        rec["params"] = sum(p.numel() for p in model.parameters())
        rec["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        rec["buffer_bytes"] = sum(b.numel() * b.element_size() for b in model.buffers())
        rec["flops_per_step"] = count_flops(model, spec, bs, device, train=True)
        opt_name = spec.get("optim", "adamw")
        opt = (torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if opt_name == "sgd"
               else torch.optim.AdamW(model.parameters(), lr=1e-4))
        rec["optimizer"] = opt_name
        if cuda:
            cleanup(cuda)
        inputs, y = make_batch(spec, bs, device)
        if nhwc:
            inputs = tuple(x.contiguous(memory_format=torch.channels_last) for x in inputs)
        amp = torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16,
                             enabled=precision == "bf16")
        step, t_end_goal = 0, None
        step_times = []
        rec["t_first_step"] = time.time() - T0
        while True:
            ts = time.time()
            phase = "warmup" if step < 3 else "train"
            if phases and step >= 3 and step % 25 == 0:
                # an evaluation pass and a data-loading stall, as real jobs have
                with torch.no_grad(), amp:
                    for _ in range(3):
                        forward_loss(model, spec, inputs, y)
                if cuda:
                    torch.cuda.synchronize()
                STEPS.row(run_id, step, "eval", ts, time.time(), bs, 0, cuda)
                time.sleep(0.25)
                ts = time.time()
            with amp:
                loss = forward_loss(model, spec, inputs, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss_v = loss.item()
            te = time.time()
            STEPS.row(run_id, step, phase, ts, te, bs, 0, cuda)
            if step == 2:
                t_end_goal = te + seconds
            elif step > 2:
                step_times.append(te - ts)
            step += 1
            if (t_end_goal is not None and te >= t_end_goal) or (steps and step >= steps):
                break
        rec["steps"] = step
        rec["loss"] = loss_v
        rec["step_time_median_s"] = sorted(step_times)[len(step_times) // 2] if step_times else None
        rec["samples_per_s"] = (bs / rec["step_time_median_s"]) if step_times else None
        if cuda:
            rec["peak_alloc_bytes"] = torch.cuda.max_memory_allocated()
            rec["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        rec["status"] = "ok"
    except torch.cuda.OutOfMemoryError as e:
        rec["status"] = "oom"
        rec["error"] = str(e)[:300]
    except Exception as e:
        rec["status"] = "error"
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        log(traceback.format_exc()[-800:])
    rec["t_end"] = time.time() - T0
    del model, opt
    cleanup(cuda)
    record_run(rec)
    log(run_id, spec["model"], bs, precision, rec["status"], rec.get("step_time_median_s"),
        rec.get("peak_reserved_bytes"))
    return rec


def serve_run(run_id, spec, max_batch, precision, seconds, device, seed):
    """An inference service with dynamic batching under a time-varying request load."""
    cuda = device == "cuda"
    rng = random.Random(seed)
    rec = {"run_id": run_id, "kind": "serve", "batch": max_batch, "precision": precision,
           "seconds": seconds, **spec, "pid": os.getpid()}
    rec["t_begin"] = time.time() - T0
    model = None
    try:
        model = build_model(spec, device).eval()
        rec["params"] = sum(p.numel() for p in model.parameters())
        rec["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        rec["flops_per_sample"] = (count_flops(model, spec, 1, device, train=False))
        base = spec["rate"]  # requests per second at the mean
        period = seconds / 2.0
        bursts = sorted(rng.uniform(0.1, 0.9) * seconds for _ in range(2))
        rec["load"] = {"base_rps": base, "period_s": period, "bursts_at_s": bursts}
        amp = torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16,
                             enabled=precision == "bf16")
        q, step, start, last = 0, 0, time.time(), time.time()
        served = 0
        while time.time() - start < seconds:
            now = time.time()
            el = now - start
            lam = base * (1 + 0.8 * math.sin(2 * math.pi * el / period))
            lam *= 3.0 if any(b <= el < b + 1.5 for b in bursts) else 1.0
            dt = now - last
            last = now
            # Poisson arrivals in dt
            k, p, L = 0, 1.0, math.exp(-lam * dt)
            while True:
                p *= rng.random()
                if p < L or k > 10000:
                    break
                k += 1
            q += k
            if q == 0:
                time.sleep(0.004)
                continue
            bs = min(q, max_batch)
            inputs, y = make_batch(spec, bs, device)
            ts = time.time()
            with torch.no_grad(), amp:
                if spec.get("generate"):
                    model.generate(inputs["input_ids"], max_new_tokens=spec["generate"],
                                   do_sample=False, pad_token_id=0)
                else:
                    forward_loss(model, spec, inputs, y) if spec["lib"] != "torchvision" else model(*inputs)
            if cuda:
                torch.cuda.synchronize()
            te = time.time()
            q -= bs
            served += bs
            STEPS.row(run_id, step, "serve", ts, te, bs, q, cuda)
            step += 1
        rec["served"] = served
        rec["steps"] = step
        if cuda:
            rec["peak_alloc_bytes"] = torch.cuda.max_memory_allocated()
            rec["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        rec["status"] = "ok"
    except Exception as e:
        rec["status"] = "error"
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        log(traceback.format_exc()[-800:])
    rec["t_end"] = time.time() - T0
    del model
    cleanup(cuda)
    record_run(rec)
    log(run_id, "serve", spec["model"], rec["status"], rec.get("served"))
    return rec


# ---------------------------------------------------------------- the plan
TV = lambda m, **kw: {"lib": "torchvision", "model": m, **kw}  # noqa: E731


def HF(model, config, arch, seq, task, **kw):
    return {"lib": "transformers", "model": model, "config": config, "arch": arch,
            "seq": seq, "task": task, **kw}


LLAMA_SMALL = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
               "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 32000}
GPT2_MED = {"n_embd": 1024, "n_layer": 24, "n_head": 16}
BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
              "intermediate_size": 4096}

# (spec, batch sizes, precisions); order: breadth first
MODELS = [
    (TV("resnet50"), [32, 128, 256], ["fp32", "bf16"]),
    (HF("bert-base", "BertConfig", "BertForSequenceClassification", 128, "cls"), [32, 128], ["fp32", "bf16"]),
    (TV("vgg16", optim="sgd"), [32, 128], ["fp32", "bf16"]),
    (HF("gpt2", "GPT2Config", "GPT2LMHeadModel", 512, "lm", vocab=50257), [8, 32], ["bf16", "fp32"]),
    (TV("mobilenet_v2", optim="sgd"), [64, 256], ["fp32", "bf16"]),
    (TV("vit_b_16"), [32, 128], ["bf16", "fp32"]),
    (TV("efficientnet_b0"), [64, 256], ["bf16", "fp32"]),
    (TV("swin_t"), [32, 128], ["bf16", "fp32"]),
    (HF("llama-150m", "LlamaConfig", "LlamaForCausalLM", 1024, "lm", vocab=32000, config_kwargs=LLAMA_SMALL), [4, 16], ["bf16"]),
    (TV("resnet18", optim="sgd"), [64, 256], ["fp32", "bf16"]),
    (TV("convnext_tiny"), [32, 128], ["bf16", "fp32"]),
    (TV("alexnet", optim="sgd"), [128, 512], ["fp32", "bf16"]),
    (TV("resnet152"), [32, 96], ["bf16", "fp32"]),
    (TV("mobilenet_v3_large", optim="sgd"), [64, 256], ["bf16", "fp32"]),
    (HF("distilbert", "DistilBertConfig", "DistilBertForSequenceClassification", 128, "cls"), [32, 128], ["fp32", "bf16"]),
    (TV("regnet_y_1_6gf"), [64, 128], ["fp32", "bf16"]),
    (TV("shufflenet_v2_x1_0", optim="sgd"), [128, 512], ["fp32", "bf16"]),
    (HF("gpt2-medium", "GPT2Config", "GPT2LMHeadModel", 512, "lm", vocab=50257, config_kwargs=GPT2_MED), [8], ["bf16"]),
    (TV("wide_resnet50_2"), [32, 96], ["bf16", "fp32"]),
    (TV("inception_v3", image=299), [32, 96], ["fp32", "bf16"]),
    (TV("squeezenet1_1", optim="sgd"), [128, 512], ["fp32", "bf16"]),
    (HF("bert-large", "BertConfig", "BertForSequenceClassification", 256, "cls", config_kwargs=BERT_LARGE), [8, 32], ["bf16"]),
    (TV("resnext50_32x4d"), [32, 128], ["bf16", "fp32"]),
    (TV("mnasnet1_0", optim="sgd"), [64, 256], ["fp32", "bf16"]),
    (TV("convnext_base"), [32, 64], ["bf16"]),
    (TV("efficientnet_b3", image=300), [32, 64], ["bf16", "fp32"]),
    (TV("vgg11", optim="sgd"), [64, 128], ["bf16", "fp32"]),
    (TV("swin_b"), [16, 64], ["bf16"]),
]

SERVICES = [
    (TV("resnet50"), 128, "bf16", {"rate": 900}),
    (HF("bert-base", "BertConfig", "BertForSequenceClassification", 128, "cls"), 64, "bf16", {"rate": 500}),
    (HF("gpt2", "GPT2Config", "GPT2LMHeadModel", 64, "lm", vocab=50257), 16, "bf16", {"rate": 40, "generate": 16}),
]

PAIRS = [
    ((TV("resnet50"), 64, "bf16"), (HF("bert-base", "BertConfig", "BertForSequenceClassification", 128, "cls"), 32, "bf16")),
    ((TV("vgg16", optim="sgd"), 64, "fp32"), (HF("gpt2", "GPT2Config", "GPT2LMHeadModel", 512, "lm", vocab=50257), 8, "bf16")),
]


def plan(dry):
    """Breadth first: each model's first config, then the rest."""
    first, rest = [], []
    for spec, bss, precs in MODELS:
        combos = [(b, p) for b in bss for p in precs]
        # keep it to at most 3 configs per model
        sel = [combos[0]] + ([combos[-1]] if len(combos) > 1 else []) + (combos[1:2] if len(combos) > 2 else [])
        first.append((spec, *sel[0]))
        rest.extend((spec, b, p) for b, p in sel[1:])
    items = first + rest
    if dry:
        items = ([it for it in items if it[0]["model"] in ("resnet18", "bert-base", "gpt2", "mobilenet_v2")]
                 or items)[:4]
        # batch 2, and sequences of at most 32 tokens: a CPU without bf16 instructions emulates bf16 matmuls
        # (a GPT-2 step at 512 tokens takes many minutes there); a dry run checks the format, not the figures
        items = [({**s, "seq": min(s["seq"], 32)} if "seq" in s else s, 2, p) for s, _, p in items]
    return items


def read_plan(path):
    """MODELS from a JSON file: a list of [spec, batch sizes, precisions] (ValueError naming what is wrong)."""
    try:
        with open(path) as f:
            items = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--plan {path}: {e}") from e
    if not isinstance(items, list) or not items:
        raise ValueError(f"--plan {path}: expected a non-empty JSON list of [spec, batch sizes, precisions]")
    plan_items = []
    for i, item in enumerate(items):
        ok = (isinstance(item, list) and len(item) == 3 and isinstance(item[0], dict)
              and item[0].get("lib") in ("torchvision", "timm", "transformers") and item[0].get("model")
              and isinstance(item[1], list) and item[1] and all(isinstance(b, int) and b > 0 for b in item[1])
              and isinstance(item[2], list) and item[2] and all(p in ("fp32", "bf16") for p in item[2])
              and isinstance(item[0].get("phases", False), bool))
        if not ok:
            raise ValueError(f"--plan {path}: item {i} is not [{{\"lib\": torchvision|timm|transformers, "
                             f"\"model\": ..., \"phases\": true|false (optional)}}, [batch sizes > 0], [fp32|bf16, ...]]: "
                             f"{json.dumps(item)[:200]}")
        plan_items.append((item[0], list(item[1]), list(item[2])))
    return plan_items


STEPS = None


def read_pairs(path):
    """PAIRS from a JSON file: a list of {"a": [spec, batch, precision], "b": [...], "mode":
    "time-slicing" | "mps"} (ValueError naming what is wrong); the members' solo runs as MODELS items."""
    try:
        with open(path) as f:
            items = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--pairs {path}: {e}") from e
    if not isinstance(items, list) or not items:
        raise ValueError(f"--pairs {path}: expected a non-empty JSON list of pairs")
    pairs, solo = [], []
    for i, item in enumerate(items):
        members = [item.get(k) for k in ("a", "b")] if isinstance(item, dict) else []
        ok = (len(members) == 2 and item.get("mode", "time-slicing") in ("time-slicing", "mps")
              and all(isinstance(m, list) and len(m) == 3 and isinstance(m[0], dict) and m[0].get("model")
                      and m[0].get("lib") in ("torchvision", "timm", "transformers")
                      and isinstance(m[1], int) and m[1] > 0 and m[2] in ("fp32", "bf16") for m in members))
        if not ok:
            raise ValueError(f"--pairs {path}: item {i} is not {{\"a\": [spec, batch, fp32|bf16], \"b\": [...], "
                             f"\"mode\": time-slicing|mps}}: {json.dumps(item)[:200]}")
        pairs.append((tuple(members[0]), tuple(members[1]), item.get("mode", "time-slicing")))
        for spec, bs, prec in members:
            if (spec, [bs], [prec]) not in solo:
                solo.append((spec, [bs], [prec]))
    return pairs, solo


def mps(on):
    """Start (or stop) the MPS control daemon; False where it cannot be (the pair then runs time-sliced)."""
    try:
        if on:
            return subprocess.run(["nvidia-cuda-mps-control", "-d"], timeout=20).returncode == 0
        return subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as e:
        log("mps", "on" if on else "off", "failed:", e)
        return False


def host_benchmark(cuda, n=4000):
    """How fast this host issues work: microseconds per tiny kernel launch (queued, no sync), per small
    linear layer and per synchronised round trip. Step times of small, host-bound jobs scale with these."""
    if not cuda:
        return {}
    x = torch.zeros(16, device="cuda")
    w = torch.zeros(16, 16, device="cuda")

    def per_call_us(fn, calls):
        for _ in range(20):  # warm-up: the first linear layer also creates cuBLAS's handle
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        return round((time.perf_counter() - t) / calls * 1e6, 2)

    return {"host_launch_us": per_call_us(lambda: x.add_(1.0), n),
            "host_linear_us": per_call_us(lambda: torch.nn.functional.linear(x, w), n // 4),
            "host_sync_us": per_call_us(lambda: (x.add_(1.0), torch.cuda.synchronize()), n // 8)}


def write_env(env):
    with open(os.path.join(OUT, "env.json"), "w") as f:
        json.dump(env, f, indent=1)


def host_cpu():
    """The host's CPU model and core count (hosts of the same GPU can differ)."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu_model": model, "cpu_count": os.cpu_count()}


def main():
    global STEPS, NO_FLOPS, MEMORY_FORMAT
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=330.0,
                    help="seconds for the whole session (a --dry-run runs every item regardless)")
    ap.add_argument("--run-seconds", type=float, default=2.5)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--single")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--tag", default="x")
    ap.add_argument("--skip", type=int, default=0, help="start at this plan item")
    ap.add_argument("--no-flops", action="store_true")
    ap.add_argument("--memory-format", choices=("nchw", "nhwc"), default="nchw",
                    help="image models' memory format for every run (nhwc: channels_last); recorded in env.json")
    ap.add_argument("--no-services", action="store_true")
    ap.add_argument("--no-benchmark", action="store_true")
    ap.add_argument("--plan", help="JSON file of [spec, batch sizes, precisions] items to run instead of MODELS")
    ap.add_argument("--pairs", metavar="PLAN", help="co-located pairs (tools/plans/pairs*.json): each member "
                    "alone, then each pair, time-sliced or under MPS, instead of MODELS, services and PAIRS")
    ap.add_argument("--ddp", metavar="PLAN", help="several GPUs: data-parallel steps of a tools/plans/ddp*.json plan "
                    "(torchrun, NCCL) by tools/collect_ddp_steps.py, into $OUT/ddp")
    args = ap.parse_args()
    MEMORY_FORMAT = args.memory_format
    if args.ddp:  # data parallel: its own script, the same OUT
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "collect_ddp_steps.py")
        os.execv(sys.executable, [sys.executable, script, "--plan", args.ddp] + ["--dry-run"] * args.dry_run)
    if args.plan:
        try:
            MODELS[:] = read_plan(args.plan)
        except ValueError as e:
            ap.error(str(e))
    if args.pairs:  # the members' solo runs, then the pairs
        try:
            PAIRS[:], MODELS[:] = read_pairs(args.pairs)
        except ValueError as e:
            ap.error(str(e))
        args.no_services = True
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    NO_FLOPS = args.no_flops
    if cuda:
        torch.backends.cudnn.benchmark = not args.no_benchmark
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    if args.single:  # a co-located tenant: one training loop, its own step log
        STEPS = StepLog(os.path.join(OUT, "steps_pairs.csv"))
        spec = json.loads(args.single)
        train_run(args.tag, spec["spec"], spec["batch"], spec["precision"], args.seconds,
                  0, device, spec["spec"].get("phases", False))
        return

    STEPS = StepLog(os.path.join(OUT, "steps.csv"))
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": device,
           "python": sys.version.split()[0], "memory_format": MEMORY_FORMAT}
    try:
        import torchvision
        import transformers
        env["torchvision"], env["transformers"] = torchvision.__version__, transformers.__version__
        import timm
        env["timm"] = timm.__version__
    except Exception as e:
        env["import_error"] = str(e)
    if cuda:
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_total_bytes"] = torch.cuda.get_device_properties(0).total_memory
        env["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
        try:
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm",
                 "--format=csv"], capture_output=True, text=True, timeout=10).stdout
        except Exception as e:
            env["nvidia_smi"] = str(e)
    env.update(host_cpu())
    env["host_benchmark_start"] = host_benchmark(cuda)
    write_env(env)
    log("env", env)

    sampler = Sampler(os.path.join(OUT, "samples.csv"), period=0.1)
    sampler.start()
    budget = args.budget
    reserve_services = 0 if args.dry_run else 3 * 22 + 2 * 28  # keep time for services and pairs
    sampler.label = "idle"
    time.sleep(1.0)
    items = plan(args.dry_run)[args.skip:]
    n = args.skip
    if args.no_services:
        reserve_services = 0
    if args.pairs:  # keep time for the pairs after their members' solo runs
        reserve_services = 0 if args.dry_run else 25 * len(PAIRS)
    for spec, bs, prec in items:
        if not args.dry_run and time.time() - T0 > budget - reserve_services:  # a dry run checks every item
            log("budget reached before", spec["model"], bs, prec)
            break
        run_id = f"r{n:03d}"
        phases = spec.get("phases", n % 4 == 3)  # a plan item may fix it (controls repeat earlier runs)
        sampler.label = run_id
        train_run(run_id, spec, bs, prec, args.run_seconds, 2 if args.dry_run else 0, device, phases)
        sampler.label = "idle"
        time.sleep(0.3)
        n += 1

    # inference services under time-varying load
    for i, (spec, mb, prec, load) in enumerate(SERVICES):
        if args.no_services or time.time() - T0 > budget - 2 * 28:
            break
        run_id = f"s{i:02d}"
        sampler.label = run_id
        serve_run(run_id, {**spec, **load}, mb if not args.dry_run else 2, prec,
                  20.0 if not args.dry_run else 2.0, device, seed=i)
        sampler.label = "idle"
        time.sleep(0.5)

    # co-located tenants: separate processes sharing the GPU
    for i, (a, b, *mode) in enumerate(PAIRS):
        if args.dry_run or (args.no_services and not args.pairs) or time.time() - T0 > budget - 25:
            break
        run_id = f"p{i:02d}"
        use_mps = bool(mode) and mode[0] == "mps" and mps(True)
        log("pair", run_id, "mps" if use_mps else "time-slicing")
        sampler.label = run_id
        StepLog(os.path.join(OUT, "steps_pairs.csv")).f.close()  # header once
        procs = []
        for j, (spec, bs, prec) in enumerate((a, b)):
            payload = json.dumps({"spec": spec, "batch": bs, "precision": prec})
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--single", payload,
                 "--seconds", "12", "--tag", f"{run_id}{'ab'[j]}", "--memory-format", MEMORY_FORMAT],
                stdout=LOG, stderr=LOG, env={**os.environ, "OUT": OUT}))
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        if use_mps:
            mps(False)
        sampler.label = "idle"
        time.sleep(0.5)
        log("pair", run_id, [p.returncode for p in procs])

    time.sleep(0.5)
    sampler.stop.set()
    sampler.join(timeout=2)
    env["host_benchmark_end"] = host_benchmark(cuda)
    write_env(env)
    log("done", n, "training runs", env["host_benchmark_end"])


if __name__ == "__main__":
    main()
