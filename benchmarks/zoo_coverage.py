"""Coverage of `dprobe predict` beyond the training data: which models it predicts, how fast, and
whether the figures are sane (finite, memory above the parameters, utilisation 0-1).

    .venv/bin/python benchmarks/zoo_coverage.py [--models FILE] [--json]

``--models``: one job a line, as ``dprobe predict`` takes it on a shell (``MODEL --batch N
[--precision P] [--config-kwargs '{...}'] ...``; ``#`` starts a comment). The default list holds architectures and
input kinds that h200-profiles has no run of. A model dprobe refuses by name (detection models,
models that read tensor values on meta) counts as ``REFUSED``, not as a failure; anything else
that goes wrong (a traceback, a non-finite or absurd figure) is ``FAIL``.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

if TYPE_CHECKING:
    from dprobe.profiling.coldstart.predict import JobPrediction

DEFAULT_JOBS = """
timm:efficientvit_b0 --batch 64
timm:tiny_vit_5m_224 --batch 64 --precision bf16
timm:hgnetv2_b0 --batch 64
timm:mobilenetv4_conv_small --batch 128
timm:convformer_s18 --batch 32 --precision bf16
timm:repvit_m1 --batch 64
timm:hiera_tiny_224 --batch 32 --precision bf16
timm:res2net50_26w_4s --batch 64 --optimizer sgd
timm:eva02_tiny_patch14_224 --batch 64 --precision bf16
timm:crossvit_9_240 --batch 64
timm:mambaout_femto --batch 64
timm:sequencer2d_s --batch 32 --precision bf16
timm:ghostnetv2_100 --batch 64
timm:vit_base_patch16_224 --batch 128 --precision bf16 --grad-checkpointing
torchvision:efficientnet_v2_s --batch 32 --precision fp16
torchvision:swin_v2_t --batch 32 --precision bf16
torchvision:resnet50 --batch 64 --gpu a100
torchvision:r3d_18 --batch 8
torchvision:mvit_v2_s --batch 4 --precision bf16
torchvision:deeplabv3_mobilenet_v3_large --batch 8
torchvision:fasterrcnn_mobilenet_v3_large_fpn --batch 4
transformers:T5Config/T5ForConditionalGeneration --batch 16 --config-kwargs '{"d_model":256,"num_layers":4,"num_heads":4,"d_ff":1024}'
transformers:BartConfig/BartForConditionalGeneration --batch 16 --precision bf16
transformers:LlamaConfig/LlamaForCausalLM --batch 8 --precision bf16 --config-kwargs '{"hidden_size":512,"intermediate_size":1408,"num_hidden_layers":4,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":32000}'
transformers:Qwen2Config/Qwen2ForCausalLM --batch 4 --precision bf16-pure --grad-checkpointing --seq 1024 --config-kwargs '{"hidden_size":896,"intermediate_size":4864,"num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2}'
transformers:Qwen3Config/Qwen3ForCausalLM --batch 8 --precision bf16 --config-kwargs '{"hidden_size":256,"intermediate_size":768,"num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":8000}'
transformers:ViTConfig/ViTForImageClassification --batch 32 --precision bf16
transformers:SwinConfig/SwinForImageClassification --batch 16
transformers:CLIPConfig/CLIPModel --batch 16
transformers:WhisperConfig/WhisperForConditionalGeneration --batch 4 --config-kwargs '{"d_model":256,"encoder_layers":2,"decoder_layers":2,"encoder_attention_heads":4,"decoder_attention_heads":4}'
transformers:MixtralConfig/MixtralForCausalLM --batch 8 --precision bf16 --optimizer adam --config-kwargs '{"hidden_size":256,"intermediate_size":512,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"num_local_experts":4,"vocab_size":8000,"experts_implementation":"batched_mm"}'
transformers:MambaConfig/MambaForCausalLM --batch 8 --config-kwargs '{"hidden_size":256,"num_hidden_layers":4,"vocab_size":8000}'
transformers:Wav2Vec2Config/Wav2Vec2ForCTC --batch 4
transformers:Speech2TextConfig/Speech2TextForConditionalGeneration --batch 8 --precision bf16
transformers:DebertaV2Config/DebertaV2ForSequenceClassification --batch 16 --precision bf16 --config-kwargs '{"hidden_size":768,"num_hidden_layers":12,"num_attention_heads":12,"intermediate_size":3072}'
"""


def parse_jobs(text: str) -> list[list[str]]:
    """``dprobe predict`` argument lists, one per line, split as a shell would (quote JSON in '...')."""
    return [argv for argv in (shlex.split(line, comments=True) for line in text.splitlines()) if argv]


def sane(result: JobPrediction) -> str:
    """Why a prediction is not believable, or ""."""
    peak, params = result.peak_memory_bytes.p50, result.analytical.param_bytes
    for key in ("peak_memory_bytes", "device_memory_bytes", "step_time_seconds"):
        band = getattr(result, key)
        for q in ("p50", "p90"):
            if not (math.isfinite(getattr(band, q)) and getattr(band, q) > 0):
                return f"{key} {q} = {getattr(band, q)}"
    if not params <= peak < 1e15:
        return f"peak {peak:.3g} B against {params:.3g} B of parameters"
    if not 0 <= result.gpu_utilization.p50 <= 1:
        return f"utilisation {result.gpu_utilization.p50}"
    if result.step_time_seconds.p50 > 3600:
        return f"step time {result.step_time_seconds.p50:.3g} s"
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", metavar="FILE", help="jobs to predict, one a line (default: the list in this script)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args()

    from dprobe.cli import build_parser
    from dprobe.profiling.cli import predict_from_args

    text = Path(args.models).read_text() if args.models else DEFAULT_JOBS
    jobs = parse_jobs(text)
    parser = build_parser()
    rows = []
    for argv in tqdm(jobs, desc="dprobe predict", unit="model"):
        t0 = time.perf_counter()
        status, detail, result = "OK", "", None
        try:
            ns = parser.parse_args(["predict", *argv, "--json"])
            result = predict_from_args(ns)
            detail = sane(result)
            status = "FAIL" if detail else "OK"
        except ValueError as exc:  # dprobe's own refusals: GraphError, DatasetError and bad input are ValueErrors
            status, detail = "REFUSED", str(exc).splitlines()[0][:160]
        except Exception as exc:  # noqa: BLE001 - a coverage report lists every failure and goes on
            status, detail = "FAIL", f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        row = {"job": " ".join(argv), "status": status, "seconds": round(time.perf_counter() - t0, 1),
               "detail": detail}
        if result is not None:
            row.update(peak_gib=round(result.peak_memory_bytes.p50 / 2**30, 2),
                       step_ms=round(result.step_time_seconds.p50 * 1e3, 1),
                       util=result.gpu_utilization.p50, note=result.note)
        rows.append(row)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("OK", "REFUSED", "FAIL")}
    if args.json:
        print(json.dumps({"rows": rows, "counts": counts}, indent=1))
    else:
        for r in rows:
            figures = (f"{r['peak_gib']:7.2f} GiB {r['step_ms']:8.1f} ms util {r['util']:.2f}"
                       if "peak_gib" in r else " " * 35)
            print(f"{r['status']:8s} {r['seconds']:5.1f} s {figures}  {r['job'][:70]}"
                  + (f"\n{'':17s}{r['detail']}" if r["detail"] else ""))
        print(f"\n{counts['OK']} predicted, {counts['REFUSED']} refused by name, {counts['FAIL']} failed "
              f"({len(rows)} jobs)")
    sys.exit(1 if counts["FAIL"] else 0)


if __name__ == "__main__":
    main()
