"""The memory the sidecar may use, and what it derives from it.

The container's memory limit is its cgroup's (``memory.max`` on cgroup v2, ``memory.limit_in_bytes`` on v1; the
lowest from its own cgroup up), or ``memory_limit_mib`` where set. From it come two budgets: the resident
memory a child process (a job's prediction, a model graph's build) may take, which is what the sidecar leaves
of the limit less a margin (:meth:`MemoryLimit.child_budget`), and how many targets the sidecar tracks by
default (:meth:`MemoryLimit.max_targets`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MIB = 2**20
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MARGIN_BYTES = 64 * MIB  # kept free under the limit: page tables, kernel buffers, a child's growth between checks
UNLIMITED = 2**60  # cgroup v1 writes "no limit" as a number near 2**63
CGROUP_ROOT = Path("/sys/fs/cgroup")

# What the sidecar's peak resident memory grows by, measured live with the synthetic source (forecast cycles
# and scrapes; tests/test_sidecar_targets.py --measure, which checks these figures hold): a tracked target's window
# takes WINDOW_BYTES_PER_STEP a step (int64 bins, float64 sums and int32 counts of both metrics); at the peak a
# target is assumed to take PEAK_BYTES_PER_STEP a step and TARGET_BYTES more (its latest sample, its forecast
# lines, its share of a scrape's page: 88 KB measured at 730 steps, 128 KB assumed); a forecast cycle, in
# batches, and a poll's samples of the targets shed beyond the cap, CYCLE_BYTES whatever the number of targets
# (a sidecar offered 2,500 targets under 320 MiB peaked 34 MiB over with 40 MiB and 64 KiB).
WINDOW_BYTES_PER_STEP = 8 + 2 * 8 + 2 * 4
PEAK_BYTES_PER_STEP = 2 * WINDOW_BYTES_PER_STEP
TARGET_BYTES = 80 * 1024
CYCLE_BYTES = 72 * MIB
DEFAULT_MAX_TARGETS = 2000  # without a known limit; also the most derived from one (/metrics well under 1 s)


def rss_bytes(pid: int | str = "self") -> int | None:
    """Resident memory of a process (``/proc/PID/statm``); None when it is gone or there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return None


def _limit_in(directory: Path, name: str) -> int | None:
    try:
        text = (directory / name).read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 < value < UNLIMITED else None


def _lowest(base: Path, path: str, name: str) -> int | None:
    """The lowest limit ``name`` from ``base/path`` up to ``base`` (``base`` alone where ``path`` is not
    there: a cgroup namespace shows the process's own cgroup as the root)."""
    here = base / path.strip("/")
    dirs = [here, *here.parents] if here.is_dir() and here.is_relative_to(base) else [base]
    limits = [v for d in dirs if d.is_relative_to(base) and (v := _limit_in(d, name)) is not None]
    return min(limits) if limits else None


def cgroup_memory_limit(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> int | None:
    """The memory limit of this process's cgroup in bytes (cgroup v2 ``memory.max``, else v1
    ``memory.limit_in_bytes``; the lowest of its cgroup and those above it), or None without one."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:  # cgroup v2, mounted at the root (or /unified beside v1)
            found += [_lowest(base, path, "memory.max") for base in (root, root / "unified")]
        elif "memory" in controllers.split(","):
            found.append(_lowest(root / "memory", path, "memory.limit_in_bytes"))
    limits = [v for v in found if v is not None]
    return min(limits) if limits else None


@dataclass(frozen=True)
class MemoryLimit:
    """The container's memory limit (``bytes``, None: not known) and where it comes from (``origin``)."""

    bytes: int | None
    origin: str

    @staticmethod
    def find(limit_mib: float = 0.0) -> MemoryLimit:
        """``limit_mib`` (the option ``memory_limit_mib``) where set, else the cgroup's limit."""
        if limit_mib:
            return MemoryLimit(int(limit_mib * MIB), "memory_limit_mib")
        found = cgroup_memory_limit()
        return MemoryLimit(found, "the container's memory limit (cgroup)" if found else "no memory limit known")

    def __str__(self) -> str:
        return f"{self.origin}: {self.bytes / MIB:.0f} MiB" if self.bytes else self.origin

    def child_budget(self, own_bytes: int | None = None) -> int | None:
        """Resident bytes a child may take now: the limit less this process's resident memory (``own_bytes``,
        read here when not given) and :data:`MARGIN_BYTES`; None without a limit."""
        if self.bytes is None:
            return None
        own = rss_bytes() if own_bytes is None else own_bytes
        return self.bytes - (own or 0) - MARGIN_BYTES

    def max_targets(self, window_steps: int, own_bytes: int | None = None) -> tuple[int, str]:
        """How many targets fit in what the sidecar leaves of the limit (``own_bytes``: its resident memory
        now, read here when not given) less :data:`CYCLE_BYTES` and :data:`MARGIN_BYTES`, each taking
        :func:`target_bytes`; at least 1 and at most :data:`DEFAULT_MAX_TARGETS`, which is also the number
        without a limit. Returns it and why, for the log."""
        if self.bytes is None:
            return DEFAULT_MAX_TARGETS, f"{self}: the default"
        own = rss_bytes() if own_bytes is None else own_bytes
        each = target_bytes(window_steps)
        fits = (self.bytes - (own or 0) - CYCLE_BYTES - MARGIN_BYTES) // each
        count = int(min(DEFAULT_MAX_TARGETS, max(1, fits)))
        why = (f"{self} less the sidecar's {(own or 0) / MIB:.0f} MiB, {CYCLE_BYTES // MIB} MiB for a forecast "
               f"cycle and a {MARGIN_BYTES // MIB} MiB margin, at {each / 1024:.0f} KiB a target of "
               f"{window_steps} steps" + (f", at most {DEFAULT_MAX_TARGETS}" if fits > count else ""))
        if fits < 1:
            log.warning("%s leaves no room for targets: give the sidecar more memory; tracking 1", self)
        return count, why


def target_bytes(window_steps: int) -> int:
    """Peak memory a tracked target costs (bytes) with windows of ``window_steps`` steps."""
    return PEAK_BYTES_PER_STEP * window_steps + TARGET_BYTES
