"""A corpus of model graphs with labels that cost no GPU: the architectures the zoo builds (timm, torchvision,
``transformers`` configurations, recurrent and audio models), each traced on the meta device and replayed
(forward, loss, backward, AdamW step) to label it with its allocator peak, the bytes saved for backward,
FLOPs and bytes moved by kernel class and its op counts.

    python -m dprobe.pretrain.corpus --out DIR [--limit N] [--per-module K] [--timeout S]

One file per architecture under ``DIR/items/`` (PyG-ready tensors and labels, ``torch.load`` with
``weights_only=True``), and one line per architecture that could not be traced in ``DIR/failed.jsonl``: a
second run skips both and goes on where the first stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import signal
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dprobe.graph.schema import ModelGraph

log = logging.getLogger(__name__)

CORPUS_VERSION = "corpus-v1"
VISION_BATCH = 8  # every vision model traced and replayed at this batch (its default input size)
TEXT_BATCH, TEXT_SEQ = 4, 128  # text models: this batch of this many tokens
PRECISIONS = ("fp32", "bf16")  # each architecture is replayed in both (autocast bf16: AdamW, fp32 weights)
# label names of a corpus item (see :func:`labels_of`); the shares are of the replayed step's FLOPs and bytes
# moved by kernel class (dprobe.profiling.coldstart.memtrack.OP_CLASSES)
SCALAR_LABELS = ("peak_per_sample_fp32", "peak_per_sample_bf16", "saved_per_sample", "flops_per_sample",
                 "bytes_moved_per_sample", "kernels", "param_bytes", "activation_per_sample_fp32")


@dataclass(frozen=True)
class CorpusSpec:
    """One architecture of the corpus: its zoo spec, inputs and family (the unit a split leaves out)."""

    model: str
    family: str
    batch: int
    image: int | None = None
    seq: int | None = None
    config_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        text = json.dumps({**asdict(self), "v": CORPUS_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def __hash__(self) -> int:
        return hash(self.key)


class RecurrentTagger(nn.Module):
    """A token tagger over an LSTM / GRU stack (the corpus' recurrent family, built as a ``module:`` spec)."""

    def __init__(self, cell: str = "lstm", vocab: int = 8000, hidden: int = 256, layers: int = 2,
                 bidirectional: bool = False, seq: int = 64) -> None:
        super().__init__()
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.seq, self.vocab = seq, vocab
        self.emb = nn.Embedding(vocab, hidden)
        self.rnn = rnn(hidden, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.emb(tokens))[0])

    def example_inputs(self, batch: int) -> torch.Tensor:
        return torch.randint(0, self.vocab, (batch, self.seq))


def recurrent_tagger(**kwargs: Any) -> RecurrentTagger:
    """``module:dprobe.pretrain.corpus:recurrent_tagger`` (keyword arguments of :class:`RecurrentTagger`)."""
    return RecurrentTagger(**kwargs)


# transformers configurations: (config, architecture, variants of config kwargs); audio models take their
# main input (raw audio, filterbanks) from the zoo's example inputs
_SMALL = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 4}
_TINY = {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 2}
TRANSFORMERS: list[tuple[str, str, list[dict[str, Any]]]] = [
    ("BertConfig", "BertForSequenceClassification", [{}, _SMALL, _TINY]),
    ("RobertaConfig", "RobertaForMaskedLM", [{}, _SMALL]),
    ("DistilBertConfig", "DistilBertForSequenceClassification", [{}, {"dim": 256, "hidden_dim": 1024, "n_layers": 3,
                                                                      "n_heads": 4}]),
    ("AlbertConfig", "AlbertForMaskedLM", [{}, {"hidden_size": 256, "num_hidden_layers": 4, "intermediate_size": 1024}]),
    ("ElectraConfig", "ElectraForSequenceClassification", [{}, _SMALL]),
    ("DebertaV2Config", "DebertaV2ForSequenceClassification", [_SMALL, _TINY]),
    ("GPT2Config", "GPT2LMHeadModel", [{}, {"n_embd": 256, "n_layer": 4, "n_head": 4}, {"n_layer": 2}]),
    ("GPTNeoConfig", "GPTNeoForCausalLM", [{"hidden_size": 256, "num_layers": 4, "num_heads": 4,
                                            "attention_types": [[["global", "local"], 2]]}]),
    ("OPTConfig", "OPTForCausalLM", [{"hidden_size": 256, "ffn_dim": 1024, "num_hidden_layers": 4,
                                      "num_attention_heads": 4, "word_embed_proj_dim": 256}]),
    ("LlamaConfig", "LlamaForCausalLM", [{**_SMALL, "num_key_value_heads": 2, "vocab_size": 32000},
                                         {**_TINY, "num_key_value_heads": 1, "vocab_size": 16000}]),
    ("MistralConfig", "MistralForCausalLM", [{**_SMALL, "num_key_value_heads": 2, "vocab_size": 32000}]),
    ("Qwen2Config", "Qwen2ForCausalLM", [{**_SMALL, "num_key_value_heads": 2}]),
    ("PhiConfig", "PhiForCausalLM", [_SMALL]),
    ("GemmaConfig", "GemmaForCausalLM", [{**_SMALL, "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 32000}]),
    ("T5Config", "T5ForConditionalGeneration", [{"d_model": 256, "num_layers": 4, "num_heads": 4, "d_ff": 1024},
                                                {"d_model": 128, "num_layers": 2, "num_heads": 2, "d_ff": 512}]),
    ("BartConfig", "BartForConditionalGeneration", [{"d_model": 256, "encoder_layers": 3, "decoder_layers": 3,
                                                     "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                                                     "encoder_ffn_dim": 1024, "decoder_ffn_dim": 1024}]),
    ("ViTConfig", "ViTForImageClassification", [{}, _SMALL]),
    ("SwinConfig", "SwinForImageClassification", [{}]),
    ("ConvNextConfig", "ConvNextForImageClassification", [{}]),
    ("Wav2Vec2Config", "Wav2Vec2ForSequenceClassification", [{**_SMALL}]),
    ("HubertConfig", "HubertForSequenceClassification", [{**_SMALL}]),
    ("WhisperConfig", "WhisperForConditionalGeneration", [{"d_model": 256, "encoder_layers": 2, "decoder_layers": 2,
                                                           "encoder_attention_heads": 4,
                                                           "decoder_attention_heads": 4}]),
]
AUDIO_CONFIGS = ("Wav2Vec2Config", "HubertConfig")  # raw audio: the zoo's default length, not TEXT_SEQ samples
RECURRENT: list[dict[str, Any]] = [
    {"cell": "lstm", "hidden": 256, "layers": 2}, {"cell": "lstm", "hidden": 512, "layers": 1, "bidirectional": True},
    {"cell": "gru", "hidden": 256, "layers": 3}, {"cell": "gru", "hidden": 128, "layers": 1},
]


def _spread(names: list[str], k: int) -> list[str]:
    """``k`` names spread evenly over the sorted list (its first, last and between)."""
    names = sorted(names)
    if len(names) <= k:
        return names
    return [names[round(i * (len(names) - 1) / (k - 1))] for i in range(k)] if k > 1 else names[:1]


def corpus_specs(per_module: int = 3) -> list[CorpusSpec]:
    """Every architecture of the corpus: ``per_module`` timm models of each timm module, every torchvision
    classification, segmentation and video builder, the ``transformers`` configurations of
    :data:`TRANSFORMERS` and the recurrent taggers of :data:`RECURRENT`; interleaved by source so that a
    ``--limit`` takes some of each."""
    import timm
    import torchvision
    from timm.models import _registry

    from dprobe.graph.zoo import TORCHVISION_UNSUPPORTED, torchvision_group

    by_module: dict[str, list[str]] = {}
    for name in timm.list_models():
        by_module.setdefault(_registry._model_to_module.get(name, "other"), []).append(name)
    timm_specs = [CorpusSpec(f"timm:{n}", f"timm/{mod}", VISION_BATCH)
                  for mod in sorted(by_module) for n in _spread(by_module[mod], per_module)]
    tv_specs = []
    for name in sorted(torchvision.models.list_models()):
        group = torchvision_group(name)
        if group in TORCHVISION_UNSUPPORTED:
            continue
        module = torchvision.models.get_model_builder(name).__module__.split(".")[-1]
        tv_specs.append(CorpusSpec(f"torchvision:{name}", f"torchvision/{module}",
                                   2 if group in ("video", "segmentation") else VISION_BATCH))
    tf_specs = [CorpusSpec(f"transformers:{config}/{arch}", f"transformers/{config.removesuffix('Config')}",
                           TEXT_BATCH, seq=None if config in AUDIO_CONFIGS else TEXT_SEQ, config_kwargs=kw)
                for config, arch, variants in TRANSFORMERS for kw in variants]
    rnn_specs = [CorpusSpec("module:dprobe.pretrain.corpus:recurrent_tagger", "module/recurrent", TEXT_BATCH,
                            config_kwargs=kw) for kw in RECURRENT]
    sources = [timm_specs, tv_specs, tf_specs, rnn_specs]
    out: list[CorpusSpec] = []
    for i in range(max(len(s) for s in sources)):  # round robin over the sources
        out += [s[i] for s in sources if i < len(s)]
    return out


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise TimeoutError after ``seconds`` (SIGALRM: the main thread of a Unix process; elsewhere no limit)."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"took longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def labels_of(graph: ModelGraph, replays: dict[str, Any], batch: int) -> dict[str, Any]:
    """The labels of one architecture from its graph and its replays (one per precision)."""
    from dprobe.profiling.coldstart.memtrack import OP_CLASSES

    fp32 = replays["fp32"]
    ops = np.asarray(fp32.ops, dtype=np.float64).reshape(-1, 5)
    flops_by = np.bincount(ops[:, 1].astype(int), weights=ops[:, 3], minlength=len(OP_CLASSES))
    moved_by = np.bincount(ops[:, 1].astype(int), weights=ops[:, 4], minlength=len(OP_CLASSES))
    out: dict[str, Any] = {f"peak_per_sample_{p}": float(replays[p].peak_bytes) / batch for p in PRECISIONS}
    out.update(saved_per_sample=float(graph.saved_bytes) / batch, flops_per_sample=float(fp32.flops) / batch,
               bytes_moved_per_sample=float(fp32.bytes_moved) / batch, kernels=float(fp32.kernels),
               param_bytes=float(fp32.param_bytes), activation_per_sample_fp32=float(fp32.activation_bytes) / batch,
               flops_share=(flops_by / max(flops_by.sum(), 1.0)).tolist(),
               moved_share=(moved_by / max(moved_by.sum(), 1.0)).tolist(),
               op_counts=graph.kind_counts(), reserved_fp32=float(fp32.reserved_bytes))
    return out


def trace_item(spec: CorpusSpec) -> dict[str, Any]:
    """Trace one architecture and replay it in each of :data:`PRECISIONS`: its corpus item (raises
    GraphError, or whatever the model raises, where it cannot)."""
    from dprobe.data.workloads import graph_vector
    from dprobe.graph.build import build_model_graph
    from dprobe.graph.encoder import graph_to_data
    from dprobe.graph.zoo import parse_spec
    from dprobe.profiling.coldstart.replay import replay_training_step

    started = time.perf_counter()
    graph = build_model_graph(spec.model, batch=spec.batch, image=spec.image, seq=spec.seq,
                              config_kwargs=spec.config_kwargs or None)
    parsed = parse_spec(spec.model, spec.config_kwargs or None)
    replay_s = {}
    replays = {}
    for precision in PRECISIONS:
        t = time.perf_counter()
        replays[precision] = replay_training_step(parsed, spec.batch, precision, "adamw", image=spec.image,
                                                  seq=spec.seq)
        replay_s[precision] = time.perf_counter() - t
    data = graph_to_data(graph)
    return {"spec": asdict(spec), "key": spec.key, "version": CORPUS_VERSION,
            "x": data.x, "kind": data.kind, "edge_index": data.edge_index, "edge_attr": data.edge_attr,
            "kinds": [n.kind for n in graph.nodes],
            "handmade": torch.from_numpy(graph_vector(graph)), "labels": labels_of(graph, replays, spec.batch),
            "nodes": len(graph.nodes), "seconds": time.perf_counter() - started, "replay_seconds": replay_s}


def build_corpus(out: str | Path, limit: int | None = None, per_module: int = 3, timeout: float = 120.0,
                 progress: bool = True) -> dict[str, int]:
    """Trace the corpus into ``out`` (resumable: what is there, traced or failed, is skipped); returns the
    counts of items traced now, already there, failed now and failed before."""
    from tqdm.auto import tqdm

    out = Path(out)
    items = out / "items"
    items.mkdir(parents=True, exist_ok=True)
    failed_path = out / "failed.jsonl"
    failed_before = {json.loads(line)["key"] for line in failed_path.read_text().splitlines() if line.strip()} \
        if failed_path.is_file() else set()
    specs = corpus_specs(per_module)[:limit]
    counts = {"traced": 0, "cached": 0, "failed": 0, "failed_before": 0}
    bar = tqdm(specs, desc="graph corpus", disable=not progress, unit="arch")
    for spec in bar:
        path = items / f"{spec.key}.pt"
        if path.is_file():
            counts["cached"] += 1
            continue
        if spec.key in failed_before:
            counts["failed_before"] += 1
            continue
        bar.set_postfix_str(spec.model[-40:])
        try:
            with time_limit(timeout), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                item = trace_item(spec)
        except (Exception, TimeoutError) as exc:  # noqa: BLE001 - any model that cannot be traced is listed
            reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
            with failed_path.open("a") as fh:
                fh.write(json.dumps({"key": spec.key, "model": spec.model, "family": spec.family,
                                     "config_kwargs": spec.config_kwargs, "reason": reason}) + "\n")
            counts["failed"] += 1
            continue
        tmp = path.with_suffix(".tmp")
        torch.save(item, tmp)
        tmp.replace(path)
        counts["traced"] += 1
    return counts


def load_corpus(directory: str | Path) -> list[dict[str, Any]]:
    """The items :func:`build_corpus` wrote under ``directory``, in a stable order (by key)."""
    items = Path(directory) / "items"
    if not items.is_dir():
        raise FileNotFoundError(f"{directory}: no graph corpus here (make one: python -m dprobe.pretrain.corpus "
                                f"--out {directory})")
    out = [torch.load(p, weights_only=True) for p in sorted(items.glob("*.pt"))]
    return [item for item in out if item.get("version") == CORPUS_VERSION]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dprobe.pretrain.corpus", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory of the corpus (created; a second run resumes)")
    parser.add_argument("--limit", type=int, default=None, help="trace at most the first N architectures")
    parser.add_argument("--per-module", type=int, default=3, help="timm models per timm module (default 3)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds one architecture may take before it is listed as failed (default 120)")
    parser.add_argument("--list", action="store_true", help="print the architectures and families, trace nothing")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.list:
        for spec in corpus_specs(args.per_module)[:args.limit]:
            print(spec.family, spec.model, json.dumps(spec.config_kwargs) if spec.config_kwargs else "")
        return 0
    logging.basicConfig(level=logging.WARNING)
    counts = build_corpus(args.out, limit=args.limit, per_module=args.per_module, timeout=args.timeout)
    print(f"{args.out}: {counts['traced']} traced now, {counts['cached']} already there, {counts['failed']} failed "
          f"now, {counts['failed_before']} failed before (reasons: {Path(args.out) / 'failed.jsonl'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
