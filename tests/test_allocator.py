"""The caching-allocator model against the allocator's documented rules, and the trace that feeds it."""

from __future__ import annotations

import torch

from dprobe.profiling.coldstart.allocator import (
    CachingAllocatorModel,
    replay_reserved,
    round_size,
    segment_size,
)
from dprobe.profiling.coldstart.memtrack import MemoryTracker

MiB = 1 << 20


def test_rounding_and_segment_sizes() -> None:
    assert round_size(1) == 512 and round_size(513) == 1024
    assert segment_size(100) == segment_size(MiB) == 2 * MiB  # small pool
    assert segment_size(MiB + 512) == segment_size(10 * MiB - 512) == 20 * MiB  # large, below 10 MiB
    assert segment_size(10 * MiB) == 10 * MiB and segment_size(11 * MiB + 512) == 12 * MiB


def test_small_requests_share_a_segment() -> None:
    m = CachingAllocatorModel()
    for k in range(4):
        m.malloc(k, 100_000)
    assert m.reserved == 2 * MiB and m.segments == 1
    assert m.allocated == 4 * round_size(100_000)


def test_large_requests_split_a_20_mib_segment() -> None:
    m = CachingAllocatorModel()
    for k in range(3):
        m.malloc(k, 6 * MiB)  # 6 + 6 + 6 in one 20 MiB segment, 2 MiB left (split: more than 1 MiB)
    assert (m.reserved, m.segments) == (20 * MiB, 1)
    m.malloc(3, 3 * MiB)  # does not fit the 2 MiB tail: a new segment
    assert (m.reserved, m.segments) == (40 * MiB, 2)


def test_freed_neighbours_merge() -> None:
    m = CachingAllocatorModel()
    m.malloc(0, 6 * MiB)
    m.malloc(1, 6 * MiB)
    m.malloc(2, 6 * MiB)
    m.free(0)
    m.free(1)  # 0 and 1 merge into one 12 MiB block
    m.malloc(3, 11 * MiB)
    assert m.reserved == 20 * MiB
    m.free(2)
    m.free(3)  # the whole segment is one free block again
    m.malloc(4, 19 * MiB)  # 1 MiB left is not split off: the block counts as 20 MiB allocated
    assert m.reserved == 20 * MiB and m.allocated == m.peak_allocated == 20 * MiB


def test_fragmentation_costs_a_segment() -> None:
    m = CachingAllocatorModel()
    for k in range(3):
        m.malloc(k, 6 * MiB)
    m.free(1)  # a 6 MiB hole between two live blocks
    m.malloc(3, 7 * MiB)  # 6 MiB free in the hole, 2 MiB in the tail: neither fits
    assert m.reserved == 40 * MiB and m.allocated == 19 * MiB


def test_best_fit_keeps_the_large_hole() -> None:
    m = CachingAllocatorModel()
    m.malloc("a", 4 * MiB)
    m.malloc("sep1", 2 * MiB)
    m.malloc("b", 8 * MiB)
    m.malloc("sep2", 2 * MiB)
    m.free("a")
    m.free("b")
    m.malloc("c", 3 * MiB)  # best fit: the 4 MiB hole, not the 8 MiB one
    m.malloc("d", 8 * MiB)
    assert m.segments == 1


def test_tracker_records_allocations_and_frees() -> None:
    tracker = MemoryTracker()
    with tracker:
        a = torch.empty(1024, device="meta")
        b = a * 2
        del a
        c = b + 1
    kinds = [e[0] for e in tracker.events]
    assert kinds == ["alloc", "alloc", "free", "alloc"]
    assert tracker.events[0][2] == 4096 and tracker.events[2][1] == tracker.events[0][1]
    peak_allocated, reserved = replay_reserved(tracker.events)
    assert peak_allocated == 2 * 4096 and reserved == 2 * MiB
    del b, c


def test_dense_spatial_convolutions_hold_a_workspace_while_they_run() -> None:
    """A 3x3 convolution's trace has a scratch buffer the size of its input (forward) and of output
    gradient plus input (backward), freed again and counted in the peak; 1x1 and depthwise ones have none."""
    x = torch.empty(8, 16, 32, 32, device="meta", requires_grad=True)
    x_bytes = x.numel() * 4

    def trace(conv: torch.nn.Conv2d) -> MemoryTracker:
        conv = conv.to("meta")
        tracker = MemoryTracker()
        with tracker:
            conv(x).sum().backward()
        return tracker

    dense = trace(torch.nn.Conv2d(16, 16, 3, padding=1))
    scratch = [e[2] for e in dense.events if e[0] == "alloc" and e[2] in (x_bytes, 2 * x_bytes)]
    # forward: input-sized; backward: output gradient + input (same shapes here)
    assert scratch.count(2 * x_bytes) == 1
    allocs = {e[1] for e in dense.events if e[0] == "alloc"}
    frees = {e[1] for e in dense.events if e[0] == "free"}
    workspace_keys = {e[1] for e in dense.events if e[0] == "alloc" and e[2] == 2 * x_bytes}
    assert workspace_keys <= frees <= allocs  # freed again
    for conv in (torch.nn.Conv2d(16, 16, 1), torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)):
        plain = trace(conv)
        assert not any(e[0] == "alloc" and e[2] == 2 * x_bytes for e in plain.events)
        assert plain.peak < dense.peak  # same output and gradient sizes: the difference is the workspace


def test_random_traces_keep_the_allocator_consistent() -> None:
    """Blocks tile their segments, free neighbours are always merged, pools hold exactly the free blocks."""
    import numpy as np

    rng = np.random.default_rng(0)
    for _ in range(30):
        m = CachingAllocatorModel()
        live: list[int] = []
        for step in range(200):
            if live and rng.random() < 0.45:
                m.free(live.pop(int(rng.integers(len(live)))))
            else:
                live.append(step)
                m.malloc(step, int(rng.choice([rng.integers(1, MiB), rng.integers(MiB, 12 * MiB),
                                               rng.integers(10 * MiB, 40 * MiB)])))
            blocks = sorted(m._blocks.values(), key=lambda b: b.addr)
            assert sum(b.size for b in blocks) == m.reserved
            assert sum(b.size for b in blocks if not b.free) == m.allocated <= m.peak_allocated
            for a, b in zip(blocks, blocks[1:], strict=False):
                if a.segment == b.segment:
                    assert a.addr + a.size == b.addr and a.next is b and b.prev is a
                    assert not (a.free and b.free)
            assert sorted((b.size, b.addr) for b in blocks if b.free) == sorted(m._free[True] + m._free[False])
        for k in live:
            m.free(k)
        assert m.allocated == 0 and all(b.free for b in m._blocks.values())
        assert len(m._blocks) == m.segments  # everything merged back into one block per segment
