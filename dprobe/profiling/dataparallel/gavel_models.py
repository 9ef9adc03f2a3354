"""Gavel's data-parallel job types (``datasets/gavel-colocation``): what each trains, its gradient bytes and
its backward window.

Gavel's job table marks four job types distributed (data-parallel over 2, 4 and 8 GPUs): ResNet-18 on
CIFAR-10, ResNet-50 on ImageNet, a Transformer translating Multi30k and an LSTM language model on
Wikitext-2 (its recommendation, A3C and CycleGAN jobs run on one GPU only, so they have no data-parallel
row). The two ResNets are the architectures of pollux-placements' ``cifar10`` (the same ``ResNet18()``
of kuangliu's pytorch-cifar) and ``imagenet`` (torchvision's ``resnet50``): their parameter counts and
windows are that data set's, and leave-one-model-out holds each pair out together. The other two are
plain re-implementations below, with the sizes Gavel's training scripts use:

- :class:`Transformer`: attention-is-all-you-need-pytorch (2018) as Gavel's ``translation/train.py``
  builds it: 6 + 6 layers, d_model 512, 8 heads of 64, inner 2048, ``-proj_share_weight`` (the target
  embedding is the output projection), fixed sinusoid positions (not trained); vocabularies of 2,911
  (English source) and 3,149 (German target) words: that preprocessing (lower-cased, more than 5
  occurrences, sentences cut at 50 words) of Multi30k's tokenised training set;
- :class:`LanguageModel`: PyTorch's word-language-model example as Gavel's ``language_modeling/main.py``
  runs it: a 2-layer LSTM of 200 units over 200-wide embeddings of Wikitext-2's 33,278 words, an untied
  linear decoder (dense embedding gradients: every parameter is all-reduced).

``tools/gavel_dp_windows.py`` traces the two with dprobe's graph tracer and prints their parameter counts
and backward windows beside :data:`JOB_TYPES` (``--check``: exit 1 on a difference). Only shapes matter;
the weights are never trained here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JobType:
    """One of Gavel's data-parallel job types."""

    architecture: str
    group: str  # the model it is held out with (pollux-placements' folder of the same architecture, or its own)
    parameters: int  # trainable: fp32 gradients of 4 bytes each are all-reduced every step
    backward_window: float  # :func:`~.timeline.backward_window` of its traced graph
    spec: str | None  # dprobe model spec tracing it here (None: pollux-placements' models.csv gives it)


JOB_TYPES: dict[str, JobType] = {
    "ResNet-18": JobType("ResNet-18 for CIFAR-10 (pollux-placements' cifar10)", "cifar10", 11_173_962, 0.770, None),
    "ResNet-50": JobType("ResNet-50 on ImageNet (pollux-placements' imagenet)", "imagenet", 25_557_032, 0.795, None),
    "Transformer": JobType("Transformer (6+6 layers, d_model 512) on Multi30k", "transformer", 47_241_216, 0.465,
                           "module:dprobe.profiling.dataparallel.gavel_models:transformer"),
    "LM": JobType("2-layer LSTM language model (200 units) on Wikitext-2", "lm", 13_987_678, 0.042,
                  "module:dprobe.profiling.dataparallel.gavel_models:language_model"),
}
SRC_VOCAB, TGT_VOCAB, MAX_TOKENS = 2911, 3149, 52  # Multi30k as preprocessed; 50 words + <s> and </s>
WIKITEXT2_VOCAB = 33278


def _modules() -> dict[str, type]:
    """The re-implementations (built on first use: torch is imported only here)."""
    import torch
    from torch import nn

    class MultiHeadAttention(nn.Module):
        """Query, key and value projections of ``heads`` x ``d_k``, scaled dot products, an output projection
        with a residual and layer norm."""

        def __init__(self, heads: int, d_model: int, d_k: int) -> None:
            super().__init__()
            self.heads, self.d_k = heads, d_k
            self.w_qs, self.w_ks, self.w_vs = (nn.Linear(d_model, heads * d_k) for _ in range(3))
            self.fc = nn.Linear(heads * d_k, d_model)
            self.layer_norm = nn.LayerNorm(d_model)

        def forward(self, q: Any, k: Any, v: Any) -> Any:
            b, lq, _ = q.shape
            lk = k.shape[1]
            split = lambda x, n: x.view(b, n, self.heads, self.d_k).transpose(1, 2)  # noqa: E731
            attn = torch.softmax(split(self.w_qs(q), lq) @ split(self.w_ks(k), lk).transpose(-1, -2)
                                 / math.sqrt(self.d_k), dim=-1)
            out = (attn @ split(self.w_vs(v), lk)).transpose(1, 2).reshape(b, lq, -1)
            return self.layer_norm(self.fc(out) + q)

    class FeedForward(nn.Module):
        """Two position-wise layers (1 x 1 convolutions in the original) with a residual and layer norm."""

        def __init__(self, d_model: int, inner: int) -> None:
            super().__init__()
            self.w_1, self.w_2 = nn.Conv1d(d_model, inner, 1), nn.Conv1d(inner, d_model, 1)
            self.layer_norm = nn.LayerNorm(d_model)

        def forward(self, x: Any) -> Any:
            out = self.w_2(torch.relu(self.w_1(x.transpose(1, 2)))).transpose(1, 2)
            return self.layer_norm(out + x)

    class EncoderLayer(nn.Module):
        def __init__(self, d_model: int, inner: int, heads: int, d_k: int) -> None:
            super().__init__()
            self.slf_attn, self.pos_ffn = MultiHeadAttention(heads, d_model, d_k), FeedForward(d_model, inner)

        def forward(self, x: Any) -> Any:
            return self.pos_ffn(self.slf_attn(x, x, x))

    class DecoderLayer(nn.Module):
        def __init__(self, d_model: int, inner: int, heads: int, d_k: int) -> None:
            super().__init__()
            self.slf_attn = MultiHeadAttention(heads, d_model, d_k)
            self.enc_attn = MultiHeadAttention(heads, d_model, d_k)
            self.pos_ffn = FeedForward(d_model, inner)

        def forward(self, x: Any, memory: Any) -> Any:
            return self.pos_ffn(self.enc_attn(self.slf_attn(x, x, x), memory, memory))

    class Transformer(nn.Module):
        """The encoder-decoder Transformer of Gavel's translation job; 47,241,216 trainable parameters."""

        def __init__(self, src_vocab: int = SRC_VOCAB, tgt_vocab: int = TGT_VOCAB, max_tokens: int = MAX_TOKENS,
                     d_model: int = 512, inner: int = 2048, layers: int = 6, heads: int = 8, d_k: int = 64) -> None:
            super().__init__()
            self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
            self.src_word_emb = nn.Embedding(src_vocab, d_model, padding_idx=0)
            self.tgt_word_emb = nn.Embedding(tgt_vocab, d_model, padding_idx=0)
            self.position_enc = nn.Embedding(max_tokens + 1, d_model)
            self.position_enc.weight.requires_grad_(False)  # a fixed sinusoid table
            self.encoder = nn.ModuleList(EncoderLayer(d_model, inner, heads, d_k) for _ in range(layers))
            self.decoder = nn.ModuleList(DecoderLayer(d_model, inner, heads, d_k) for _ in range(layers))
            self.tgt_word_prj = nn.Linear(d_model, tgt_vocab, bias=False)
            self.tgt_word_prj.weight = self.tgt_word_emb.weight  # -proj_share_weight
            self.scale = d_model ** -0.5

        def forward(self, src: Any, src_pos: Any, tgt: Any, tgt_pos: Any) -> Any:
            memory = self.src_word_emb(src) + self.position_enc(src_pos)
            for layer in self.encoder:
                memory = layer(memory)
            out = self.tgt_word_emb(tgt) + self.position_enc(tgt_pos)
            for layer in self.decoder:
                out = layer(out, memory)
            return self.tgt_word_prj(out) * self.scale

        def example_inputs(self, batch: int, words: int = 24) -> tuple[Any, ...]:
            """A batch of source and target sentences of ``words`` tokens, with their positions."""
            ids = lambda vocab: torch.randint(1, vocab, (batch, words), device="meta")  # noqa: E731
            pos = torch.arange(1, words + 1, device="meta").expand(batch, words)
            return ids(self.src_vocab), pos, ids(self.tgt_vocab), pos

    class LanguageModel(nn.Module):
        """Embeddings, a 2-layer LSTM and a linear decoder over the vocabulary; 13,987,678 parameters."""

        def __init__(self, vocab: int = WIKITEXT2_VOCAB, width: int = 200, layers: int = 2) -> None:
            super().__init__()
            self.vocab = vocab
            self.encoder = nn.Embedding(vocab, width)
            self.rnn = nn.LSTM(width, width, layers)
            self.decoder = nn.Linear(width, vocab)

        def forward(self, tokens: Any) -> Any:  # [T, N]
            out, _ = self.rnn(self.encoder(tokens))
            return self.decoder(out)

        def example_inputs(self, batch: int, bptt: int = 35) -> tuple[Any]:
            """A batch of ``bptt`` tokens (the example's sequence length)."""
            return (torch.randint(0, self.vocab, (bptt, batch), device="meta"),)

    return {"Transformer": Transformer, "LM": LanguageModel}


def transformer() -> Any:
    """The Transformer of Gavel's translation job."""
    return _modules()["Transformer"]()


def language_model() -> Any:
    """The LSTM language model of Gavel's language-modeling job."""
    return _modules()["LM"]()


def trainable_parameters(module: Any) -> int:
    """Parameters that receive gradients (shared ones once)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
