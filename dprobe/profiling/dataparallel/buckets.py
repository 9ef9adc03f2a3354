"""The gradient all-reduce as DistributedDataParallel runs it: bucket by bucket, each bucket's ring
all-reduce overlapped with the backward that remains.

- Buckets: DDP packs gradients, in the order backward produces them, into buckets of ``bucket_cap_mb``
  (25 MB by default); the first bucket is capped at :data:`FIRST_BUCKET_BYTES` (1 MiB,
  ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``) so the first all-reduce starts early. What does not
  fill a whole bucket is taken to be the first bucket and the second, so that the last one, which backward
  never hides, is a full one (DDP's buckets end at parameter boundaries, so their sizes vary anyway), and
  gradients of one bucket or less are one bucket: then a larger gradient never syncs faster.
- When a bucket is ready: backward, the time that can hide the all-reduce, is ``overlap`` x the one-GPU
  step ``S``: at most its share of the step (:data:`BACKWARD_SHARE`, twice the forward's FLOPs), less where
  the all-reduce and backward slow each other down (copies through the host, NCCL's kernels taking SMs). The model's
  backward window ``W`` (:mod:`.timeline`: the share of backward left to run when a gradient byte is ready,
  averaged over the bytes) gives the share of backward still to run once the first ``x`` of the bytes are
  ready, ``(1 - x) ** (1 / W - 1)`` (that curve's mean over the bytes is ``W``); a bucket is ready with its
  last byte. The first bucket (the last layer's gradients, 1 MiB at most) is ready as backward starts; the
  last one as backward ends: it is never overlapped.
- Each bucket's ring all-reduce over ``N`` GPUs moves ``2 (N - 1) / N`` of its bytes over the slowest link
  of the ring (the link inside a node on one node; the slower of that and the network once the ring spans
  nodes) and pays ``2 (N - 1)`` hops of ``latency``. The all-reduces run one after another on NCCL's
  stream, each starting once its bucket is ready and the previous one is done.
- Exposed sync: how far the last all-reduce ends after backward; never more than the all-reduces' total.

Only what the data cannot give is fitted, per measured cluster (:mod:`.bucket_fit`): the bandwidths the
links reach, the per-hop latency and ``overlap``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

MB = 1024 * 1024
BUCKET_CAP_MB = 25.0  # DistributedDataParallel's bucket_cap_mb default
FIRST_BUCKET_BYTES = 1 * MB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
BACKWARD_SHARE = 2.0 / 3.0  # backward's share of a step: twice the forward's FLOPs; the most ``overlap`` can be
MIN_WINDOW = 1e-3  # a window of 0 (every byte ready as backward ends) as a finite exponent


@dataclass(frozen=True)
class LinkParams:
    """What the bucket model needs of one cluster: the bandwidths the ring's links reach (bytes per
    second), the latency of one ring hop (seconds) and the share of the one-GPU step that hides the
    all-reduce (``overlap``, at most :data:`BACKWARD_SHARE`)."""

    intra_bandwidth: float
    inter_bandwidth: float
    latency: float
    overlap: float = BACKWARD_SHARE

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def bucket_sizes(grad_bytes: float, bucket_cap_mb: float = BUCKET_CAP_MB,
                 first_bucket_bytes: float = FIRST_BUCKET_BYTES) -> np.ndarray:
    """Bytes of each DDP bucket, in the order backward fills them: what does not fill a whole bucket (its
    first ``first_bucket_bytes`` a bucket of their own), then full buckets; one bucket or less: one."""
    if not grad_bytes > 0:
        return np.zeros(0)
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be positive, not {bucket_cap_mb}")
    cap = bucket_cap_mb * MB
    if grad_bytes <= cap:
        return np.array([float(grad_bytes)])
    full, rest = divmod(float(grad_bytes), cap)
    first = min(rest, float(first_bucket_bytes))
    sizes = [b for b in (first, rest - first) if b > 0] + [cap] * int(full)
    return np.asarray(sizes, dtype=np.float64)


def ring_seconds(nbytes: np.ndarray | float, gpus: np.ndarray | int, nodes: np.ndarray | int,
                 params: LinkParams) -> np.ndarray:
    """Seconds of one ring all-reduce of ``nbytes`` over ``gpus`` GPUs on ``nodes`` nodes (0 on one GPU):
    ``2 (N - 1) / N x bytes / bandwidth + 2 (N - 1) x latency``, the bandwidth the ring's slowest link's."""
    b, n, m = (np.asarray(a, dtype=np.float64) for a in (nbytes, gpus, nodes))
    link = np.where(m > 1, min(params.inter_bandwidth, params.intra_bandwidth), params.intra_bandwidth)
    hops = 2.0 * np.maximum(n - 1.0, 0.0)
    return np.where(n > 1, hops / np.maximum(n, 1.0) * b / link + hops * params.latency, 0.0)


def ready_shares(sizes: np.ndarray, window: float) -> np.ndarray:
    """The share of backward done when each bucket is ready (its last byte), for a backward ``window``."""
    if not float(window) > 0.0:  # every byte ready only as backward ends
        return np.ones(len(sizes))
    w = float(np.clip(window, MIN_WINDOW, 1.0))
    x = np.cumsum(sizes) / max(float(np.sum(sizes)), 1e-30)
    done = 1.0 - np.clip(1.0 - x, 0.0, 1.0) ** (1.0 / w - 1.0)
    done[:1] = 0.0  # the first (at most 1 MiB: the last layer's gradients) is ready as backward starts
    done[-1:] = 1.0  # the last bucket: ready as backward ends
    return done


@dataclass(frozen=True)
class SyncBreakdown:
    """One step's all-reduce: ``exposed`` (s after backward ends), ``total`` (s of all-reduce), buckets."""

    exposed: float
    total: float
    buckets: int


def sync_breakdown(params: LinkParams, single_step: float, grad_bytes: float, gpus: int, nodes: int,
                   window: float, bucket_cap_mb: float = BUCKET_CAP_MB) -> SyncBreakdown:
    """The exposed all-reduce of one step (see the module's docstring)."""
    if gpus <= 1 or not grad_bytes > 0:
        return SyncBreakdown(0.0, 0.0, 0)
    sizes = bucket_sizes(grad_bytes, bucket_cap_mb)
    backward = params.overlap * float(single_step)
    ready = backward * ready_shares(sizes, window)
    cost = ring_seconds(sizes, gpus, nodes, params)
    end = 0.0
    for r, c in zip(ready, cost, strict=True):
        end = max(end, r) + c
    return SyncBreakdown(max(end - backward, 0.0), float(np.sum(cost)), len(sizes))


def exposed_seconds(params: LinkParams, single_step: np.ndarray, grad_bytes: np.ndarray, gpus: np.ndarray,
                    nodes: np.ndarray, window: np.ndarray | float,
                    bucket_cap_mb: float = BUCKET_CAP_MB) -> np.ndarray:
    """:func:`sync_breakdown`'s exposed seconds for many rows at once (arrays of one length)."""
    s, g, n, m = (np.atleast_1d(np.asarray(a, dtype=np.float64)) for a in (single_step, grad_bytes, gpus, nodes))
    w = np.broadcast_to(np.asarray(window, dtype=np.float64), s.shape)
    out = np.zeros(len(s))
    # rows sharing gradient bytes and window share their buckets and ready shares: group them
    keys = np.stack([g, w], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    for k, (gb, win) in enumerate(uniq):
        rows = np.flatnonzero(inverse.ravel() == k)
        if not gb > 0:
            continue
        sizes = bucket_sizes(gb, bucket_cap_mb)
        shares = ready_shares(sizes, win)
        backward = params.overlap * s[rows]
        cost = ring_seconds(sizes[None, :], n[rows, None], m[rows, None], params)  # rows x buckets
        end = np.zeros(len(rows))
        for j in range(len(sizes)):
            end = np.maximum(end, backward * shares[j]) + cost[:, j]
        out[rows] = np.where(n[rows] > 1, np.maximum(end - backward, 0.0), 0.0)
    return out
