"""Re-implementations of the pollux-placements models that no model zoo holds.

Pollux's measurements (datasets/pollux-placements) trained five models; ResNet-50 and BERT come from
torchvision and transformers, the three below do not. Each class here is a plain re-implementation of the
architecture its training code defines (named in ``models.csv``'s ``source`` column), with the same
layers, shapes and parameter count (``models.csv``'s ``parameters``), so that dprobe can trace it:

- :class:`CifarResNet18`: ResNet-18 for 32 x 32 images (3 x 3 stem, no max pool), 10 classes;
- :class:`NeuMF`: neural collaborative filtering (NeuMF-end) on MovieLens-1M;
- :class:`DeepSpeech2`: two convolutions and five bidirectional GRU layers over a spectrogram.

Only shapes matter (the weights are never trained here). Each model has ``example_inputs(batch)``, the
inputs dprobe's tracer (``module:`` specs) feeds it. Built by ``tools/pollux_backward_window.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


class BasicBlock(nn.Module):
    """Two 3 x 3 convolutions with batch norm and a shortcut (a 1 x 1 convolution when the shape changes)."""

    def __init__(self, inputs: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet18(nn.Module):
    """ResNet-18 for CIFAR-10: a 3 x 3 stem, four stages of two basic blocks (64-512 channels), average
    pooling and a linear classifier; 11,173,962 parameters."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
        self.layer1, self.layer2, self.layer3, self.layer4 = (
            nn.Sequential(BasicBlock(inputs, planes, stride), BasicBlock(planes, planes))
            for inputs, planes, stride in widths)
        self.linear = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.avg_pool2d(out, 4).flatten(1)
        return self.linear(out)

    def example_inputs(self, batch: int) -> tuple[torch.Tensor]:
        """A batch of 3 x 32 x 32 images."""
        return (torch.randn(batch, 3, 32, 32, device="meta"),)


class NeuMF(nn.Module):
    """NeuMF-end: a generalised matrix factorisation branch (user and item embeddings of ``factors``
    multiplied) beside an MLP branch (wider embeddings concatenated, ``layers`` linear layers halving the
    width), both concatenated into one output; 1,602,657 parameters on MovieLens-1M."""

    def __init__(self, users: int = 6040, items: int = 3706, factors: int = 32, layers: int = 3,
                 dropout: float = 0.0) -> None:
        super().__init__()
        wide = factors * 2 ** (layers - 1)  # each MLP embedding; the two concatenated are 2 x wide
        self.items = items
        self.user_gmf = nn.Embedding(users, factors)
        self.item_gmf = nn.Embedding(items, factors)
        self.user_mlp = nn.Embedding(users, wide)
        self.item_mlp = nn.Embedding(items, wide)
        mlp: list[nn.Module] = []
        for i in range(layers):
            width = factors * 2 ** (layers - i)
            mlp += [nn.Dropout(dropout), nn.Linear(width, width // 2), nn.ReLU()]
        self.mlp = nn.Sequential(*mlp)
        self.predict = nn.Linear(factors * 2, 1)

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        gmf = self.user_gmf(user) * self.item_gmf(item)
        mlp = self.mlp(torch.cat([self.user_mlp(user), self.item_mlp(item)], -1))
        return self.predict(torch.cat([gmf, mlp], -1)).view(-1)

    def example_inputs(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of (user, item) ids."""
        return (torch.randint(0, self.items, (batch,), device="meta"),
                torch.randint(0, self.items, (batch,), device="meta"))


class BatchRNN(nn.Module):
    """Optional batch norm over the features, then a bidirectional GRU whose two directions are summed."""

    def __init__(self, inputs: int, hidden: int, batch_norm: bool = True) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(inputs) if batch_norm else None
        self.rnn = nn.GRU(inputs, hidden, bidirectional=True, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, N, features]
        if self.norm is not None:
            steps, batch = x.shape[:2]
            x = self.norm(x.reshape(steps * batch, -1)).reshape(steps, batch, -1)
        x, _ = self.rnn(x)
        return x.view(x.size(0), x.size(1), 2, -1).sum(2)


class DeepSpeech2(nn.Module):
    """DeepSpeech2: two 2-D convolutions over a spectrogram (161 frequency bins for 20 ms windows at
    16 kHz), ``layers`` bidirectional GRU layers of ``hidden`` units, batch norm and a linear layer to
    ``labels`` characters; 41,187,968 parameters with the defaults."""

    def __init__(self, hidden: int = 800, layers: int = 5, labels: int = 29, sample_rate: int = 16000,
                 window_size: float = 0.02) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, 32, (41, 11), (2, 2), (20, 5)), nn.BatchNorm2d(32), nn.Hardtanh(0, 20),
            nn.Conv2d(32, 32, (21, 11), (2, 1), (10, 5)), nn.BatchNorm2d(32), nn.Hardtanh(0, 20))
        self.freq = int(sample_rate * window_size / 2 + 1)
        freq = (self.freq + 2 * 20 - 41) // 2 + 1  # after the first convolution
        freq = (freq + 2 * 10 - 21) // 2 + 1  # after the second
        rnns = [BatchRNN(freq * 32, hidden, batch_norm=False)] + [BatchRNN(hidden, hidden) for _ in range(layers - 1)]
        self.rnns = nn.Sequential(*rnns)
        self.fc = nn.Sequential(nn.BatchNorm1d(hidden), nn.Linear(hidden, labels, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, 1, freq, T]
        x = self.conv(x)
        batch, channels, freq, steps = x.shape
        x = x.view(batch, channels * freq, steps).permute(2, 0, 1).contiguous()  # [T, N, features]
        x = self.rnns(x)
        steps, batch, hidden = x.shape
        return self.fc(x.reshape(steps * batch, hidden)).reshape(steps, batch, -1)

    def example_inputs(self, batch: int, frames: int = 400) -> tuple[torch.Tensor]:
        """A batch of spectrograms, ``frames`` 10 ms frames (4 s) long."""
        return (torch.randn(batch, 1, self.freq, frames, device="meta"),)


def cifar_resnet18() -> CifarResNet18:
    """ResNet-18 as Pollux's cifar10 job trains it."""
    return CifarResNet18()


def neumf() -> NeuMF:
    """NeuMF-end as Pollux's ncf job trains it (MovieLens-1M, 32 factors, 3 MLP layers)."""
    return NeuMF()


def deepspeech2() -> DeepSpeech2:
    """DeepSpeech2 as Pollux's deepspeech2 job trains it (5 GRU layers of 800, 29 labels)."""
    return DeepSpeech2()
