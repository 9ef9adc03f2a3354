#!/usr/bin/env python3
"""The job types of datasets/gavel-colocation as dprobe traces them, and their cold-start profiles.

Gavel (OSDI '20) measured 26 job types alone and in pairs on K80, P100 and V100 GPUs. ResNet-50 is
torchvision's; the others are plain re-implementations of the architectures Gavel's training code
(``workloads/pytorch`` of its repository) defines, with the same layers and shapes, so that dprobe can
trace them (``module:gavel_models:FACTORY`` specs, this folder on ``sys.path``):

- ResNet-18 on CIFAR-10: ``CifarResNet18`` of tools/pollux_models.py (3 x 3 stem, 32 x 32 images);
- Transformer: Multi30k translation, 6 + 6 layers of width 512, 8 heads, 2048 inner (``nn.Transformer``),
  target projection shared with the target embedding; ~3,000-word vocabularies, 32 tokens a sentence;
- LM: Wikitext-2 word model, a 2-layer LSTM of 200 over 200-wide embeddings, 33,278 words, 35 steps;
- Recommendation: the ML-20M autoencoder (recoder's ``DynamicAutoencoder``): a user's watched items
  summed into 200 units (tanh), decoded over all 20,108 items;
- A3C: the Atari actor-critic (four convolutions with max pooling, an LSTM cell of 512, actor and
  critic heads) unrolled over a 20-step rollout of one worker, batch = environments stepped at once;
- CycleGAN: two ResNet generators (9 residual blocks) and two PatchGAN discriminators on 256 x 256
  images; one step runs the generators six times and the discriminators six times.

Only shapes matter (the weights are never trained here); vocabulary sizes and sentence lengths of the
data sets are approximations where the training code reads them from its data.

``--write`` predicts every job type alone on each GPU with dprobe's cold-start profiler (fp32, the job's
optimizer, the GPUs' data-sheet figures) and writes dprobe/sharing/gavel_profiles.json, which the
co-location model's fit and its tests read (no tracing at run time):

    .venv/bin/python tools/gavel_models.py --write [--jobs ResNet-18,LM]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROFILES = ROOT / "dprobe" / "sharing" / "gavel_profiles.json"
if str(HERE) not in sys.path:  # module: specs import gavel_models (and pollux_models) from this folder
    sys.path.insert(0, str(HERE))

from pollux_models import CifarResNet18  # noqa: E402


class Transformer(nn.Module):
    """Encoder-decoder Transformer for translation (``attention-is-all-you-need-pytorch`` as Gavel trains
    it): token embeddings plus sinusoid positions, ``nn.Transformer`` of ``layers`` + ``layers`` post-norm
    layers, the output projection tied to the target embedding."""

    def __init__(self, src_vocab: int = 3000, tgt_vocab: int = 3000, d_model: int = 512, heads: int = 8,
                 layers: int = 6, inner: int = 2048, seq: int = 32, dropout: float = 0.1) -> None:
        super().__init__()
        self.seq, self.src_vocab, self.tgt_vocab = seq, src_vocab, tgt_vocab
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        position = torch.arange(seq, dtype=torch.float32).unsqueeze(1)
        rate = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        table = torch.zeros(seq, d_model)
        table[:, 0::2], table[:, 1::2] = torch.sin(position * rate), torch.cos(position * rate)
        self.register_buffer("positions", table, persistent=False)
        self.core = nn.Transformer(d_model, heads, layers, layers, inner, dropout, batch_first=True)
        self.project = nn.Linear(d_model, tgt_vocab, bias=False)
        self.project.weight = self.tgt_embed.weight

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        n = tgt.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf"), device=tgt.device), diagonal=1)
        x = self.src_embed(src) + self.positions[: src.shape[1]]
        y = self.tgt_embed(tgt) + self.positions[:n]
        return self.project(self.core(x, y, tgt_mask=mask, tgt_is_causal=True))

    def example_inputs(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Source and target sentences of ``seq`` tokens."""
        return (torch.randint(0, self.src_vocab, (batch, self.seq), device="meta"),
                torch.randint(0, self.tgt_vocab, (batch, self.seq), device="meta"))


class LstmLanguageModel(nn.Module):
    """Word-level LSTM language model (PyTorch's word_language_model example, Gavel's LM): embedding,
    ``layers`` LSTM layers with dropout, a linear decoder over the vocabulary; inputs [steps, batch]."""

    def __init__(self, vocab: int = 33278, width: int = 200, layers: int = 2, steps: int = 35,
                 dropout: float = 0.2) -> None:
        super().__init__()
        self.vocab, self.steps = vocab, steps
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab, width)
        self.rnn = nn.LSTM(width, width, layers, dropout=dropout)
        self.decoder = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.drop(self.encoder(tokens)))
        return self.decoder(self.drop(out))

    def example_inputs(self, batch: int) -> tuple[torch.Tensor]:
        """``steps`` tokens of ``batch`` streams (back-propagation through time over ``steps``)."""
        return (torch.randint(0, self.vocab, (self.steps, batch), device="meta"),)


class AutoencoderRecommender(nn.Module):
    """recoder's ``DynamicAutoencoder`` on MovieLens-20M: the embeddings of a user's items (input noise
    drops half) summed into ``hidden`` units with tanh, decoded by a linear layer over every item."""

    def __init__(self, items: int = 20108, hidden: int = 200, watched: int = 100, noise: float = 0.5) -> None:
        super().__init__()
        self.items, self.watched = items, watched
        self.noise = nn.Dropout(noise)
        self.encoder = nn.Embedding(items, hidden)
        self.encoder_bias = nn.Parameter(torch.zeros(hidden))
        self.decoder = nn.Linear(hidden, items)

    def forward(self, watched: torch.Tensor) -> torch.Tensor:
        code = torch.tanh(self.noise(self.encoder(watched)).sum(1) + self.encoder_bias)
        return self.decoder(code)

    def example_inputs(self, batch: int) -> tuple[torch.Tensor]:
        """``watched`` item ids per user."""
        return (torch.randint(0, self.items, (batch, self.watched), device="meta"),)


class A3CLstm(nn.Module):
    """The A3C actor-critic for Atari (rl_a3c_pytorch, Gavel's A3C): four convolutions, each followed by
    2 x 2 max pooling, on 80 x 80 frames, an LSTM cell of 512, a value and a policy head; a forward runs
    a ``rollout`` of steps, each feeding the cell's state to the next."""

    def __init__(self, actions: int = 6, rollout: int = 20) -> None:
        super().__init__()
        self.rollout = rollout
        self.conv = nn.Sequential(
            nn.Conv2d(1, 32, 5, 1, 2), nn.MaxPool2d(2, 2), nn.ReLU(),
            nn.Conv2d(32, 32, 5, 1, 1), nn.MaxPool2d(2, 2), nn.ReLU(),
            nn.Conv2d(32, 64, 4, 1, 1), nn.MaxPool2d(2, 2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1, 1), nn.MaxPool2d(2, 2), nn.ReLU())
        self.lstm = nn.LSTMCell(1024, 512)
        self.critic = nn.Linear(512, 1)
        self.actor = nn.Linear(512, actions)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:  # [rollout, batch, 1, 80, 80]
        batch = frames.shape[1]
        hx = frames.new_zeros(batch, 512)
        cx = frames.new_zeros(batch, 512)
        outs = []
        for t in range(frames.shape[0]):
            hx, cx = self.lstm(self.conv(frames[t]).flatten(1), (hx, cx))
            outs.append(torch.cat([self.critic(hx), F.log_softmax(self.actor(hx), -1)], -1))
        return torch.stack(outs)

    def example_inputs(self, batch: int) -> tuple[torch.Tensor]:
        """A rollout of 80 x 80 frames for ``batch`` environments."""
        return (torch.randn(self.rollout, batch, 1, 80, 80, device="meta"),)


class ResidualBlock(nn.Module):
    """Two 3 x 3 reflection-padded convolutions with instance norm, added to the input."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.ReflectionPad2d(1), nn.Conv2d(channels, channels, 3), nn.InstanceNorm2d(channels), nn.ReLU(inplace=True),
            nn.ReflectionPad2d(1), nn.Conv2d(channels, channels, 3), nn.InstanceNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


def _generator(channels: int = 3, blocks: int = 9) -> nn.Sequential:
    """PyTorch-GAN's ``GeneratorResNet``: a 7 x 7 stem of 64, two stride-2 downsamplings, ``blocks``
    residual blocks of 256, two upsamplings and a 7 x 7 output with tanh."""
    layers: list[nn.Module] = [nn.ReflectionPad2d(channels), nn.Conv2d(channels, 64, 7), nn.InstanceNorm2d(64),
                               nn.ReLU(inplace=True)]
    width = 64
    for _ in range(2):
        layers += [nn.Conv2d(width, width * 2, 3, 2, 1), nn.InstanceNorm2d(width * 2), nn.ReLU(inplace=True)]
        width *= 2
    layers += [ResidualBlock(width) for _ in range(blocks)]
    for _ in range(2):
        layers += [nn.Upsample(scale_factor=2), nn.Conv2d(width, width // 2, 3, 1, 1), nn.InstanceNorm2d(width // 2),
                   nn.ReLU(inplace=True)]
        width //= 2
    layers += [nn.ReflectionPad2d(channels), nn.Conv2d(64, channels, 7), nn.Tanh()]
    return nn.Sequential(*layers)


def _discriminator(channels: int = 3) -> nn.Sequential:
    """PyTorch-GAN's PatchGAN ``Discriminator``: four stride-2 4 x 4 convolutions (64-512), a 1-channel map."""
    layers: list[nn.Module] = []
    width_in = channels
    for i, width in enumerate((64, 128, 256, 512)):
        layers.append(nn.Conv2d(width_in, width, 4, 2, 1))
        if i:
            layers.append(nn.InstanceNorm2d(width))
        layers.append(nn.LeakyReLU(0.2, inplace=True))
        width_in = width
    layers += [nn.ZeroPad2d((1, 0, 1, 0)), nn.Conv2d(512, 1, 4, padding=1)]
    return nn.Sequential(*layers)


class CycleGAN(nn.Module):
    """CycleGAN's training step as one module: generators A->B and B->A, discriminators of A and B, and
    the losses of a step (identity, adversarial, cycle; each discriminator on real and generated images)."""

    def __init__(self, image: int = 256, blocks: int = 9) -> None:
        super().__init__()
        self.image = image
        self.g_ab, self.g_ba = _generator(blocks=blocks), _generator(blocks=blocks)
        self.d_a, self.d_b = _discriminator(), _discriminator()

    def forward(self, real_a: torch.Tensor, real_b: torch.Tensor) -> torch.Tensor:
        identity = F.l1_loss(self.g_ba(real_a), real_a) + F.l1_loss(self.g_ab(real_b), real_b)
        fake_b, fake_a = self.g_ab(real_a), self.g_ba(real_b)
        adversarial = self.d_b(fake_b).square().mean() + self.d_a(fake_a).square().mean()
        cycle = F.l1_loss(self.g_ba(fake_b), real_a) + F.l1_loss(self.g_ab(fake_a), real_b)
        generator = adversarial + 10 * cycle + 5 * identity
        d_a = self.d_a(real_a).square().mean() + self.d_a(fake_a.detach()).square().mean()
        d_b = self.d_b(real_b).square().mean() + self.d_b(fake_b.detach()).square().mean()
        return generator + d_a + d_b

    def example_inputs(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of images of each domain."""
        shape = (batch, 3, self.image, self.image)
        return torch.randn(*shape, device="meta"), torch.randn(*shape, device="meta")


def resnet18_cifar() -> CifarResNet18:
    """ResNet-18 as Gavel's CIFAR-10 job trains it."""
    return CifarResNet18()


def transformer() -> Transformer:
    """The Multi30k translation Transformer of Gavel's Transformer jobs."""
    return Transformer()


def lstm_lm() -> LstmLanguageModel:
    """The Wikitext-2 LSTM language model of Gavel's LM jobs."""
    return LstmLanguageModel()


def recommender() -> AutoencoderRecommender:
    """The ML-20M autoencoder of Gavel's Recommendation jobs."""
    return AutoencoderRecommender()


def a3c() -> A3CLstm:
    """The Pong actor-critic of Gavel's A3C job."""
    return A3CLstm()


def cyclegan() -> CycleGAN:
    """The monet2photo CycleGAN of Gavel's CycleGAN job."""
    return CycleGAN()


# Gavel's model name -> (dprobe model spec, optimizer as dprobe names it, batch traced when Gavel gives none)
JOB_TYPES: dict[str, tuple[str, str, int | None]] = {
    "ResNet-18": ("module:gavel_models:resnet18_cifar", "sgd", None),
    "ResNet-50": ("torchvision:resnet50", "sgd", None),
    "Transformer": ("module:gavel_models:transformer", "adam", None),
    "LM": ("module:gavel_models:lstm_lm", "sgd", None),
    "Recommendation": ("module:gavel_models:recommender", "adam", None),
    "A3C": ("module:gavel_models:a3c", "adam", 1),
    "CycleGAN": ("module:gavel_models:cyclegan", "adam", 1),
}


def gavel_gpus() -> dict[str, Any]:
    """The GPUs of Gavel's cluster as dprobe's GPUSpec (vendor data sheets; fp32 training, so no tensor
    cores on the paths taken): one GK210 of a Tesla K80, Tesla P100 PCIe 16 GB, Tesla V100 SXM2 16 GB."""
    from dprobe.core.gpus import gpu_spec_from_dict

    sheets = {
        "k80": {"name": "Tesla K80 (one GK210)", "memory_gib": 11.17, "fp32_tflops": 4.37, "fp16_tflops": 4.37,
                "bandwidth_gbps": 240, "sm_count": 13, "l2_mib": 1.5, "boost_clock_mhz": 875},
        "p100": {"name": "Tesla P100 PCIe 16GB", "memory_gib": 15.9, "fp32_tflops": 9.3, "fp16_tflops": 18.7,
                 "bandwidth_gbps": 732, "sm_count": 56, "l2_mib": 4, "boost_clock_mhz": 1303},
        "v100": {"name": "Tesla V100 SXM2 16GB", "memory_gib": 15.78, "fp32_tflops": 15.7, "fp16_tflops": 125,
                 "bandwidth_gbps": 900, "sm_count": 80, "l2_mib": 6, "boost_clock_mhz": 1530},
    }
    return {key: gpu_spec_from_dict(sheet, key) for key, sheet in sheets.items()}


def job_batches(csv: Path | None = None) -> dict[str, list[int | None]]:
    """The (model, batch) job types of throughputs.csv, batch None where Gavel gives none."""
    import pandas as pd

    from dprobe.sharing.gavel import DEFAULT_CSV

    frame = pd.read_csv(csv or DEFAULT_CSV)
    out: dict[str, list[int | None]] = {}
    for (model, batch), _ in frame.groupby(["model_a", "batch_a"], dropna=False):
        out.setdefault(str(model), []).append(None if pd.isna(batch) else int(batch))
    return out


def profile_job(model: str, batch: int | None, gpus: dict[str, Any]) -> dict[str, Any]:
    """dprobe's cold-start prediction of one job type alone on each GPU (``dprobe predict --json``'s
    fields that the co-location model reads)."""
    from dprobe.profiling.coldstart.predict import predict_job

    spec, optimizer, default_batch = JOB_TYPES[model]
    traced = batch if batch is not None else default_batch
    out: dict[str, Any] = {"model": model, "batch": batch, "spec": spec, "batch_traced": traced,
                           "optimizer": optimizer, "precision": "fp32", "gpus": {}}
    for key, gpu in gpus.items():
        pred = predict_job(spec, int(traced), precision="fp32", optimizer=optimizer, gpu=gpu).as_dict()
        out["gpus"][key] = {k: pred[k] for k in ("gpu_utilization", "device_memory_bytes", "peak_memory_bytes",
                                                "step_time_seconds", "analytical", "fits")}
        out["gpus"][key]["gpu_memory_bytes"] = pred["gpu_memory_bytes"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help=f"write {PROFILES.relative_to(ROOT)}")
    ap.add_argument("--jobs", default=None, help="comma-separated Gavel model names (default: all)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    gpus = gavel_gpus()
    wanted = set(args.jobs.split(",")) if args.jobs else None
    old = json.loads(PROFILES.read_text()) if PROFILES.is_file() else {}
    profiles = {p["key"]: p for p in old.get("jobs", [])}
    for model, batches in job_batches().items():
        if wanted and model not in wanted:
            continue
        for batch in batches:
            start = time.time()
            prof = profile_job(model, batch, gpus)
            prof["key"] = f"{model}|{'' if batch is None else batch}"
            profiles[prof["key"]] = prof
            g = prof["gpus"]["v100"]
            print(f"{model:15s} {str(batch):>5s}  V100: utilisation {g['gpu_utilization']['p50']:.2f}, "
                  f"memory {g['device_memory_bytes']['p50'] / 2**30:5.2f} GiB, step "
                  f"{1000 * g['step_time_seconds']['p50']:7.2f} ms  ({time.time() - start:.0f} s)", flush=True)
    if args.write:
        doc = {"about": "dprobe's cold-start profile of each Gavel job type alone (tools/gavel_models.py --write)",
               "gpus": {k: {"name": g.name, "memory_bytes": g.memory_bytes, "fp32_flops": g.peak_flops_fp32,
                            "bandwidth": g.bandwidth} for k, g in gpus.items()},
               "jobs": sorted(profiles.values(), key=lambda p: p["key"])}
        PROFILES.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote {PROFILES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
