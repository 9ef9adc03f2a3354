"""How jobs are ordered within a virtual cluster of the fixed-size cluster (:mod:`dprobe.sim.fixed`).

Five policies, each as schedulers of GPU clusters describe it:

- ``fifo``: by submission; nothing passes the head of the queue.
- ``sjf``: shortest logged duration first (an oracle: the log's own duration); nothing passes the head.
- ``qssf``: Helios' quasi-shortest-service-first: the least *estimated* GPU-time (GPUs x duration) first,
  the duration predicted from the finished jobs of the same user (same GPU count first), else of the
  VC, else of the whole cluster (:class:`DurationEstimator`); nothing passes the head.
- ``tiresias``: Tiresias' discretised two-dimensional least-attained-service: a job's priority queue
  is set by the GPU-seconds it has received (``thresholds``), FIFO within a queue, and a job of a
  higher queue preempts running jobs of lower ones (they resume later, paying the restart cost). Its
  starvation guard (the Tiresias paper's STARVELIMIT): a job of a lower queue that has waited
  ``starve_limit`` times as long as it has run is promoted to the highest queue, its attained service
  counted afresh from there.
- ``easy``: EASY backfilling: FIFO, the head job holds a reservation at the time the VC's running
  jobs are estimated to leave it room (estimates as ``qssf``'s), and a later job may start now if it
  is estimated to end before then or fits in what the head leaves over.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from dataclasses import dataclass

SCHEDULING_NAMES: tuple[str, ...] = ("fifo", "sjf", "qssf", "tiresias", "easy")
# Tiresias' queue thresholds in GPU-seconds: 2 queues split at 5 GPU-hours, as Helios' simulator runs it
DEFAULT_LAS_THRESHOLDS: tuple[float, ...] = (18000.0,)
# Tiresias' starvation guard: a queued job of a lower queue is promoted once it has waited this many times as
# long as it has run (0: never)
DEFAULT_STARVE_LIMIT = 2.0
PRIOR_SECONDS = 3600.0  # a duration estimate before any job has finished
BACKFILL_DEPTH = 100  # queued jobs a pass looks at past the first that cannot start (Slurm's bf_max_job_test)


@dataclass(frozen=True)
class Scheduling:
    """A within-VC policy: its name and how its queue behaves."""

    name: str
    las_thresholds: tuple[float, ...] = DEFAULT_LAS_THRESHOLDS
    starve_limit: float = DEFAULT_STARVE_LIMIT  # tiresias: promote after waiting this many times its run time

    def __post_init__(self) -> None:
        if self.name not in SCHEDULING_NAMES:
            raise ValueError(f"unknown scheduling policy {self.name!r}; choose from "
                             f"{', '.join(SCHEDULING_NAMES)}")
        t = self.las_thresholds
        if not t or any(not (math.isfinite(x) and x > 0) for x in t) or list(t) != sorted(set(t)):
            raise ValueError(f"LAS thresholds must be increasing positive GPU-seconds, got {list(t)}")
        if not (math.isfinite(self.starve_limit) and self.starve_limit >= 0):
            raise ValueError(f"--starve-limit must be a number >= 0 (0: no promotion), got {self.starve_limit:g}")

    @property
    def uses_estimates(self) -> bool:
        return self.name in ("qssf", "easy")

    def level(self, attained: float) -> int:
        """Tiresias' queue (0: highest) for a job that has received ``attained`` GPU-seconds."""
        return bisect.bisect_right(self.las_thresholds, attained + 1e-6)

    def promotion_wait(self, run_seconds: float) -> float | None:
        """Seconds a queued job of a lower queue that has run ``run_seconds`` waits before it is promoted to the
        highest queue (None: never)."""
        return self.starve_limit * run_seconds if self.starve_limit > 0 else None

    def next_threshold(self, attained: float) -> float | None:
        """The GPU-seconds at which a job leaves its queue for the next (None: the last queue)."""
        k = self.level(attained)
        return self.las_thresholds[k] if k < len(self.las_thresholds) else None


class DurationEstimator:
    """Helios' history-based duration estimate: the mean duration of finished jobs of the same user with
    the same GPU count, else of that user, else of the VC with the same GPU count, else of the VC, else
    of every finished job, else :data:`PRIOR_SECONDS`. Only jobs that have finished count (no look-ahead)."""

    def __init__(self) -> None:
        self._sums: dict[tuple, list[float]] = {}  # key -> [sum of durations, count]

    @staticmethod
    def _keys(user: str | None, vc: int, gpus: int) -> list[tuple]:
        keys: list[tuple] = [("user-gpus", user, gpus), ("user", user)] if user is not None else []
        return [*keys, ("vc-gpus", vc, gpus), ("vc", vc), ("all",)]

    def observe(self, user: str | None, vc: int, gpus: int, duration: float) -> None:
        """A job has finished after ``duration`` seconds of work."""
        for key in self._keys(user, vc, gpus):
            acc = self._sums.get(key)
            if acc is None:
                self._sums[key] = [duration, 1.0]
            else:
                acc[0] += duration
                acc[1] += 1.0

    def estimate(self, user: str | None, vc: int, gpus: int) -> float:
        """The estimated duration (seconds) of a job about to be queued."""
        for key in self._keys(user, vc, gpus):
            acc = self._sums.get(key)
            if acc is not None:
                return acc[0] / acc[1]
        return PRIOR_SECONDS


class SortedJobs:
    """Job indices ordered by a key fixed while they are in it (a sorted list of ``(key, job)``)."""

    def __init__(self) -> None:
        self._items: list[tuple[float, int]] = []
        self._key: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[int]:
        return (job for _, job in self._items)

    def __contains__(self, job: int) -> bool:
        return job in self._key

    def head(self) -> int:
        return self._items[0][1]

    def entries(self) -> list[tuple[float, int]]:
        """The ``(key, job)`` pairs in order (the list itself: read it, do not change it)."""
        return self._items

    def push(self, job: int, key: float) -> None:
        bisect.insort(self._items, (key, job))
        self._key[job] = key

    def remove(self, job: int) -> None:
        item = (self._key.pop(job), job)
        del self._items[bisect.bisect_left(self._items, item)]

    def key(self, job: int) -> float:
        return self._key[job]


def reservation(now: float, need: int, room: int, running_ends: list[tuple[float, int]]) -> tuple[float, int]:
    """EASY's reservation for a head job of ``need`` GPUs in a VC with ``room`` GPUs of quota free now:
    the shadow time (when, by the estimated ends ``(end, gpus)`` of its running jobs, the room first
    covers the head; an estimate already past counts as ending now) and the GPUs left over then.
    ``(inf, 0)`` when the running jobs never free enough."""
    if room >= need:
        return now, room - need
    for end, gpus in sorted(running_ends):
        room += gpus
        if room >= need:
            return max(end, now), room - need
    return math.inf, 0
