"""How jobs are ordered and started within a virtual cluster of the fixed-size cluster
(:mod:`dprobe.sim.fixed.cluster`).

Five policies, each as schedulers of GPU clusters describe it, each a :class:`Strategy` the cluster calls
(:func:`strategy_for`): the key that orders a VC's queue, a scheduling pass over the VCs whose queues may
move, and for Tiresias the events of its queues (demotion, promotion):

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
import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dprobe.sim.fixed.cluster import FixedCluster

SCHEDULING_NAMES: tuple[str, ...] = ("fifo", "sjf", "qssf", "tiresias", "easy")
# Tiresias' queue thresholds in GPU-seconds: 2 queues split at 5 GPU-hours, as Helios' simulator runs it
DEFAULT_LAS_THRESHOLDS: tuple[float, ...] = (18000.0,)
# Tiresias' starvation guard: a queued job of a lower queue is promoted once it has waited this many times as
# long as it has run (0: never)
DEFAULT_STARVE_LIMIT = 2.0
PRIOR_SECONDS = 3600.0  # a duration estimate before any job has finished
BACKFILL_DEPTH = 100  # queued jobs a pass looks at past the first that cannot start (Slurm's bf_max_job_test)
# the cluster's heap events (time, kind, job or VC, epoch); at one instant they run in this order
FINISH, DEMOTE, LENDABLE, PROMOTE = 0, 1, 2, 3


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


# --- the policies as strategies of the cluster ----------------------------------------------------------------


class Borrowing:
    """What a scheduling pass may lend: ``pool`` GPUs, leaving ``reserved`` free for in-quota jobs."""

    def __init__(self, pool: int, reserved: int) -> None:
        self.pool = pool
        self.reserved = reserved


class Strategy:
    """How one run's cluster orders and serves its VCs' queues: ``fifo``, and what the others change.

    The cluster (:class:`~dprobe.sim.fixed.cluster.FixedCluster`) keeps the state (queues, running jobs,
    quotas, nodes, lending) and calls :meth:`key` when it queues a job, the hooks when a job is queued,
    starts or stops, and :meth:`schedule` when queues may move. A fresh strategy per run: Tiresias keeps
    state."""

    def __init__(self, sched: Scheduling, n_vcs: int) -> None:
        self.sched = sched

    def key(self, c: FixedCluster, j: int) -> float:
        """The job's place in its VC's queue, lowest first (fixed while it is queued): submission order."""
        return float(j)

    def enqueued(self, c: FixedCluster, j: int, now: float) -> None:
        """Job ``j`` joined its VC's queue (at submission or when preempted)."""

    def started(self, c: FixedCluster, j: int, now: float) -> None:
        """Job ``j`` started (or restarted)."""

    def stopped(self, c: FixedCluster, j: int) -> None:
        """Job ``j`` left its GPUs (finished or preempted)."""

    def on_event(self, c: FixedCluster, kind: int, j: int, now: float) -> None:
        """An event this strategy put on the cluster's heap is due (only Tiresias puts any)."""
        raise ValueError(f"{self.sched.name} has no events of kind {kind}")

    def schedule(self, c: FixedCluster, todo: list[int], now: float) -> None:
        """Start jobs of the VCs ``todo`` (in order): every VC within its quota first; then, with lending,
        every VC borrowing, leaving free the GPUs that in-quota jobs left waiting need."""
        blocked = {v: self.run_vc(c, v, now, None) for v in todo}
        if c.policy.lending:
            lend = Borrowing(c.pool(now), sum(blocked.values()))
            if lend.pool > 0:
                for v in todo:
                    if c.queues[v] and not blocked[v]:
                        self.run_vc(c, v, now, lend)

    def run_vc(self, c: FixedCluster, v: int, now: float, lend: Borrowing | None) -> int:
        """One VC's pass: start jobs from the head of its queue while they fit (within the quota, or
        borrowing from ``lend``); nothing passes the head. Returns the GPUs of an in-quota head left waiting
        for GPUs (lent out, or fragmented)."""
        queue = c.queues[v]
        c.waits_on_others[v] = False
        while queue:
            j = queue.head()
            gpus = c.size[j]
            if c.used[v] + gpus <= c.q[v]:
                alloc = c.place_in_quota(v, gpus, now)
                if alloc is None:
                    c.waits_on_others[v] = True
                    return gpus
            elif lend is None or (alloc := c.borrow(v, gpus, lend)) is None:
                return 0
            c.start(j, alloc, now)
        return 0


class Fifo(Strategy):
    """First submitted first; nothing passes the head."""


class Sjf(Strategy):
    """Shortest logged duration first (an oracle); nothing passes the head."""

    def key(self, c: FixedCluster, j: int) -> float:
        return c.duration[j]


class Qssf(Strategy):
    """Least estimated GPU-time first (Helios); nothing passes the head."""

    def key(self, c: FixedCluster, j: int) -> float:
        return c.estimate[j] * c.size[j]


class Easy(Strategy):
    """EASY backfilling: FIFO, and later jobs start if estimated not to delay the head."""

    def run_vc(self, c: FixedCluster, v: int, now: float, lend: Borrowing | None) -> int:
        blocked = super().run_vc(c, v, now, lend)
        if c.queues[v]:
            self.backfill(c, v, now, lend)
        return blocked

    def backfill(self, c: FixedCluster, v: int, now: float, lend: Borrowing | None) -> None:
        """Later jobs start now if estimated to end before the head's reservation, or to fit in what the head
        leaves over then."""
        queue = c.queues[v]
        room = c.q[v] - c.used[v]
        if room <= 0 and (lend is None or lend.pool <= 0):
            return
        head = queue.head()
        ends = [(c.est_end[j], c.size[j]) for j in c.running[v]]
        shadow, extra = reservation(now, c.size[head], room, ends)
        for j in list(islice(queue, 1, BACKFILL_DEPTH + 1)):
            gpus = c.size[j]
            before = now + c.estimate[j] <= shadow
            if not before and gpus > extra:
                continue
            if c.used[v] + gpus <= c.q[v]:
                alloc = c.nodes.place(gpus)
            else:
                alloc = c.borrow(v, gpus, lend) if lend is not None else None
            if alloc is not None:
                c.start(j, alloc, now)
                if not before:
                    extra -= gpus


class Tiresias(Strategy):
    """Discretised 2D-LAS: queues by GPU-seconds received, FIFO within a queue, higher queues preempt lower
    ones, with the starvation guard. Keeps each VC's running jobs by queue, and puts its demotions and
    promotions on the cluster's heap."""

    def __init__(self, sched: Scheduling, n_vcs: int) -> None:
        super().__init__(sched, n_vcs)
        self.by_level = [SortedJobs() for _ in range(n_vcs)]  # running jobs by (queue, submission)

    def key(self, c: FixedCluster, j: int) -> float:
        return float(self.sched.level(c.attained[j] - c.base[j]))

    def enqueued(self, c: FixedCluster, j: int, now: float) -> None:
        if c.attained[j] > c.base[j]:
            wait = self.sched.promotion_wait(c.attained[j] / c.size[j])
            if wait is not None and self.key(c, j) > 0:
                heapq.heappush(c.events, (now + wait, PROMOTE, j, c.epoch[j]))

    def started(self, c: FixedCluster, j: int, now: float) -> None:
        self.by_level[c.vc[j]].push(j, self.key(c, j))
        self.schedule_demotion(c, j, now)

    def stopped(self, c: FixedCluster, j: int) -> None:
        self.by_level[c.vc[j]].remove(j)

    def on_event(self, c: FixedCluster, kind: int, j: int, now: float) -> None:
        if kind == PROMOTE:
            self.promote(c, j, now)
        elif kind == DEMOTE:
            self.demote(c, j, now)
        else:
            super().on_event(c, kind, j, now)

    def schedule_demotion(self, c: FixedCluster, j: int, now: float) -> None:
        """Put on the heap the moment the running job ``j`` crosses its queue's threshold (if it runs that long)."""
        att = c.attained[j] - c.base[j] + c.size[j] * (now - c.run_start[j])
        threshold = self.sched.next_threshold(att)
        if threshold is not None:
            # at least 1 ms on: at epoch-second clocks, a crossing less than a float step away would round to
            # now and be scheduled again at now for ever
            at = max(now + (threshold - att) / c.size[j], now + 1e-3)
            if at < c.run_start[j] + c.remaining[j]:
                heapq.heappush(c.events, (at, DEMOTE, j, c.epoch[j]))

    def demote(self, c: FixedCluster, j: int, now: float) -> None:
        """A running job's GPU-seconds crossed a threshold: it moves to the next queue."""
        v = c.vc[j]
        running = self.by_level[v]
        level = float(self.sched.level(c.attained[j] - c.base[j] + c.size[j] * (now - c.run_start[j])))
        if level != running.key(j):
            running.remove(j)
            running.push(j, level)
            if c.queues[v]:
                c.dirty.add(v)
        self.schedule_demotion(c, j, now)

    def promote(self, c: FixedCluster, j: int, now: float) -> None:
        """The starvation guard: a job of a lower queue waited too long; it goes to the highest queue."""
        v = c.vc[j]
        c.queues[v].remove(j)
        c.base[j] = c.attained[j]
        c.queues[v].push(j, self.key(c, j))
        c.promotions += 1
        c.dirty.add(v)

    def schedule(self, c: FixedCluster, todo: list[int], now: float) -> None:
        """One pass: the lending pool is part of each VC's capacity."""
        lend = Borrowing(c.pool(now) if c.policy.lending else 0, 0)
        for v in todo:
            lend.reserved += self.run_las(c, v, now, lend)

    def run_las(self, c: FixedCluster, v: int, now: float, lend: Borrowing) -> int:
        """One VC's pass: take jobs by (queue, submission) while they fit the VC's capacity (its quota or what it already
        holds, plus the lending pool); start the queued ones taken, preempting running ones not taken (lowest
        queue, latest submitted first) to keep within the capacity or to make room. Returns the GPUs of
        in-quota jobs left waiting for GPUs."""
        queue, running = c.queues[v], self.by_level[v]
        base = max(c.q[v], c.used[v])
        cap = base + lend.pool
        excess_before = max(0, c.used[v] - c.q[v])
        queued = queue.entries()
        if running and queued[0] < running.entries()[-1]:  # a queued job outranks a running one
            order, left = sorted(running.entries() + queued), cap
        else:  # every running job is taken first: only the room left matters
            order, left = queued, cap - c.used[v]
            if left <= 0:
                return 0
        to_start, victims, seen, skipped = [], [], 0, 0
        for _, j in order:
            gpus = c.size[j]
            if c.alloc[j] is not None:
                seen += 1
                if gpus <= left:
                    left -= gpus
                else:
                    victims.append(j)
            elif gpus <= left:
                left -= gpus
                to_start.append(j)
            else:
                skipped += 1
                if skipped > BACKFILL_DEPTH and (seen == len(running) or order is queued):
                    break
        blocked = 0
        c.waits_on_others[v] = False
        for j in to_start:
            gpus = c.size[j]
            while c.used[v] + gpus > cap and victims:
                self.preempt(c, victims.pop(), now)
            if c.used[v] + gpus > base and c.nodes.free - lend.reserved < gpus:
                continue
            alloc = c.nodes.place(gpus)
            if alloc is None and victims:
                before = c.preemption_count
                alloc = c.place_preempting([x for x in reversed(victims) if c.alloc[x] is not None], gpus, now)
                c.las_preempts += c.preemption_count - before
            if alloc is None and c.used[v] + gpus <= c.q[v]:
                alloc = c.place_in_quota(v, gpus, now)
                if alloc is None:
                    blocked += gpus
                    c.waits_on_others[v] = True
            if alloc is not None:
                c.start(j, alloc, now)
        lend.pool -= max(0, max(0, c.used[v] - c.q[v]) - excess_before)
        return blocked

    def preempt(self, c: FixedCluster, j: int, now: float) -> None:
        """Preempt a running job of a lower queue (if it still runs)."""
        if c.alloc[j] is not None:
            c.preempt(j, now)
            c.las_preempts += 1


STRATEGIES: dict[str, type[Strategy]] = {"fifo": Fifo, "sjf": Sjf, "qssf": Qssf, "tiresias": Tiresias,
                                         "easy": Easy}


def strategy_for(sched: Scheduling, n_vcs: int) -> Strategy:
    """A fresh strategy of ``sched``'s policy for one run over ``n_vcs`` VCs."""
    return STRATEGIES[sched.name](sched, n_vcs)
