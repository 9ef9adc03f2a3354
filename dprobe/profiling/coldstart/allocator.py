"""A model of PyTorch's CUDA caching allocator, replayed over a recorded trace of allocations and frees.

What the device holds is not the live bytes but the *segments* the caching allocator has
reserved from the driver, and it never gives them back during training. This module replays
the alloc / free trace of a meta-tensor training step (:class:`dprobe.profiling.coldstart.memtrack.MemoryTracker`)
through the allocator's rules (``c10/cuda/CUDACachingAllocator.cpp``, default settings):

- requests are rounded up to 512 bytes;
- requests of at most 1 MiB come from the *small* pool, carved out of 2 MiB segments;
  larger ones from the *large* pool: 20 MiB segments below 10 MiB, else the request rounded
  up to 2 MiB;
- a request takes the best-fitting free block of its pool (smallest that fits, then lowest
  address); the block is split when the rest is at least 512 bytes (small pool) or more than
  1 MiB (large pool);
- a freed block merges with free neighbours of its segment; segments are never released.

The result is the reserved memory (sum of segments) at its peak, which is what NVML shows
minus the CUDA context and library handles.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # largest request served by the small pool
SMALL_BUFFER = 2 << 20  # small-pool segment size
LARGE_BUFFER = 20 << 20  # segment size for large requests below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20

Event = tuple[str, int, int]  # ("alloc" | "free", allocation id, requested bytes)


def round_size(nbytes: int) -> int:
    """The allocator's request rounding: at least 512 bytes, in multiples of 512."""
    return MIN_BLOCK if nbytes < MIN_BLOCK else -(-int(nbytes) // MIN_BLOCK) * MIN_BLOCK


def segment_size(nbytes: int) -> int:
    """Bytes reserved from the driver when no cached block fits a (rounded) request."""
    if nbytes <= SMALL_SIZE:
        return SMALL_BUFFER
    if nbytes < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-nbytes // ROUND_LARGE) * ROUND_LARGE


@dataclass
class _Block:
    addr: int
    size: int
    small: bool
    segment: int
    free: bool = True
    prev: _Block | None = field(default=None, repr=False)
    next: _Block | None = field(default=None, repr=False)


class CachingAllocatorModel:
    """Replays allocations and frees; tracks allocated and reserved bytes and their peaks."""

    def __init__(self) -> None:
        self._free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # pool -> sorted (size, addr)
        self._blocks: dict[int, _Block] = {}  # addr -> block (free or in use)
        self._live: dict[int, _Block] = {}  # allocation id -> block
        self._next_addr = 0
        self.segments = 0
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0

    def malloc(self, key: int, nbytes: int) -> None:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            _, addr = pool.pop(i)
            block = self._blocks[addr]
        else:
            block = self._new_segment(segment_size(size), small)
        remaining = block.size - size
        if (remaining >= MIN_BLOCK) if small else (remaining > SMALL_SIZE):
            rest = _Block(block.addr + size, remaining, small, block.segment, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._blocks[rest.addr] = rest
            bisect.insort(pool, (rest.size, rest.addr))
        block.free = False
        self._live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: int) -> None:
        block = self._live.pop(key, None)
        if block is None:
            return
        self.allocated -= block.size
        block.free = True
        pool = self._free[block.small]
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                pool.pop(bisect.bisect_left(pool, (neighbour.size, neighbour.addr)))
                del self._blocks[neighbour.addr]
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    del self._blocks[block.addr]
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
                self._blocks[block.addr] = block
        bisect.insort(pool, (block.size, block.addr))

    def _new_segment(self, size: int, small: bool) -> _Block:
        block = _Block(self._next_addr, size, small, self.segments)
        self._next_addr += size + ROUND_LARGE  # a gap: blocks of different segments never merge
        self.segments += 1
        self._blocks[block.addr] = block
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def replay(self, events: list[Event]) -> CachingAllocatorModel:
        for kind, key, nbytes in events:
            if kind == "alloc":
                if nbytes > 0:  # empty tensors take no memory
                    self.malloc(key, nbytes)
            else:
                self.free(key)
        return self


def replay_reserved(events: list[Event]) -> tuple[int, int]:
    """(peak allocated, peak reserved) bytes of a trace under the caching allocator's rules."""
    model = CachingAllocatorModel().replay(events)
    return model.peak_allocated, model.peak_reserved
