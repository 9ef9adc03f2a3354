"""The fixed-size cluster: a set number of GPUs on nodes, split into VC quotas that a policy may move.

- The cluster has ``gpus`` GPUs on nodes of ``gpus_per_node``. A job's GPUs are packed on as few nodes as
  possible (Helios' consolidated placement): a job of up to a node's GPUs on one node (the fullest that
  fits), a larger one on whole free nodes plus one node for the rest. A job that cannot be placed so waits.
- Each VC has a quota; the quotas sum to the total (:mod:`dprobe.sim.fixed.quota_split`). A job starts within
  its VC's quota when the VC's running jobs leave room for it; with lending, a job beyond the quota may
  borrow GPUs other VCs have left idle (quota not held and not asked for by their queues) for at least
  ``lend_delay`` seconds.
- GPUs lent (held beyond a quota, by borrowing or because the quota moved) are reclaimed when their VC
  needs them for a job within its quota: by waiting for the borrowing jobs to finish (the default), or with
  ``preempt`` by preempting the most recently started of them. A preempted job goes back to its queue,
  keeps its progress (a checkpoint) and pays ``restart_cost`` seconds when it runs again.
- Within a VC the queue is served by a :class:`~dprobe.sim.fixed.scheduling.Scheduling` policy, whose
  :class:`~dprobe.sim.fixed.scheduling.Strategy` orders the queue and runs the scheduling passes.
- A job asking for more GPUs than the cluster, or than its VC can ever hold (its static quota when there is
  no lending), is excluded on arrival and counted, never silently dropped.

Queueing delay is all the time a job waits in a queue, including after a preemption.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice

import numpy as np

from dprobe.sim.fixed.quota_split import FixedQuotaPolicy
from dprobe.sim.fixed.scheduling import (
    FINISH,
    LENDABLE,
    Borrowing,
    DurationEstimator,
    Scheduling,
    SortedJobs,
    strategy_for,
)
from dprobe.sim.jobs import DAY, JobTable
from dprobe.sim.replay import check_span, progress_bar
from dprobe.sim.view import ClusterView, DemandHistory

INCLUDED, OVER_CLUSTER, OVER_VC = 0, 1, 2  # why a job was excluded


@dataclass(frozen=True)
class FixedConfig:
    """The cluster and the rules of the fixed-size simulation."""

    gpus: int
    gpus_per_node: int = 8
    scheduling: Scheduling = field(default_factory=lambda: Scheduling("fifo"))
    interval: float = 600.0  # seconds between quota decisions
    lend_delay: float = 300.0  # GPUs idle this long may be lent
    preempt: bool = False  # reclaim lent GPUs by preempting; False: wait for the borrowing jobs to finish
    restart_cost: float = 60.0  # seconds a preempted job spends again when it restarts
    stall_seconds: float = 7 * DAY  # after the last submission, give up when nothing ran for this long

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1:
            raise ValueError(f"--gpus-per-node must be >= 1, got {self.gpus_per_node}")
        if self.gpus < 1 or self.gpus % self.gpus_per_node:
            raise ValueError(f"--gpus must be a positive multiple of --gpus-per-node ({self.gpus_per_node}), "
                             f"got {self.gpus}")
        if not (math.isfinite(self.interval) and self.interval > 0):
            raise ValueError(f"--interval must be a positive number of seconds, got {self.interval:g}")
        for name, value in (("lend-delay", self.lend_delay), ("restart-cost", self.restart_cost)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"--{name} must be >= 0 seconds, got {value:g}")


class Nodes:
    """Free GPUs per node, with nodes bucketed by their free count for consolidated placement."""

    def __init__(self, gpus: int, per_node: int) -> None:
        self.per_node = per_node
        self.free_on = [per_node] * (gpus // per_node)
        self.by_free: list[set[int]] = [set() for _ in range(per_node + 1)]
        self.by_free[per_node] = set(range(len(self.free_on)))
        self.free = gpus

    def _set(self, node: int, value: int) -> None:
        self.by_free[self.free_on[node]].discard(node)
        self.by_free[value].add(node)
        self.free_on[node] = value

    def place(self, gpus: int) -> list[tuple[int, int]] | None:
        """Take ``gpus`` on as few nodes as possible, ``[(node, gpus)]``; None where the free GPUs do not
        allow it."""
        if gpus > self.free:
            return None
        size = self.per_node
        whole, rest = divmod(gpus, size)
        if not whole:  # the fullest node that fits
            fit = next((f for f in range(rest, size + 1) if self.by_free[f]), None)
            if fit is None:
                return None
            alloc = [(next(iter(self.by_free[fit])), rest)]
        else:
            part = next((f for f in range(rest, size) if self.by_free[f]), None) if rest else None
            extra = 1 if rest and part is None else 0
            if len(self.by_free[size]) < whole + extra:
                return None
            picks = list(islice(iter(self.by_free[size]), whole + extra))
            alloc = [(n, size) for n in picks[:whole]]
            if rest:
                alloc.append((picks[whole] if part is None else next(iter(self.by_free[part])), rest))
        self.take(alloc)
        return alloc

    def take(self, alloc: list[tuple[int, int]]) -> None:
        for node, g in alloc:
            self._set(node, self.free_on[node] - g)
            self.free -= g

    def release(self, alloc: list[tuple[int, int]]) -> None:
        for node, g in alloc:
            self._set(node, self.free_on[node] + g)
            self.free += g


@dataclass
class FixedResult:
    """What one scheduling policy under one quota policy did to one job log."""

    scheduling: str
    quota: str
    jobs: JobTable
    gpus: int
    excluded: np.ndarray  # (N,) INCLUDED, OVER_CLUSTER or OVER_VC
    first_start: np.ndarray  # (N,) NaN: excluded or never started
    end: np.ndarray  # (N,) NaN: excluded or never finished
    queued_seconds: np.ndarray  # (N,) time spent queued (never-started jobs: until the simulation ended)
    preemptions: np.ndarray  # (N,) times each job was preempted
    end_time: float
    used_gpu_seconds: np.ndarray  # (V,) GPU-seconds held by running jobs (restarts included)
    restart_gpu_seconds: float  # GPU-seconds spent restarting preempted jobs
    lent_gpu_seconds: float  # area under the GPUs held beyond quotas
    reclaim_preemptions: int  # jobs preempted to give lent GPUs back
    las_preemptions: int  # jobs preempted by a higher Tiresias queue of their own VC
    promotions: int  # Tiresias: queued jobs promoted to the highest queue by the starvation guard
    quota_changes: np.ndarray  # (V,) decisions that changed the VC's quota
    gpus_moved: int  # GPUs of quota moved between VCs, over all decisions
    decision_times: np.ndarray  # (T,)
    quota_at_decision: np.ndarray  # (V, T) quota after each decision
    demand_at_decision: np.ndarray  # (V, T) GPUs held + queued when deciding
    wall_seconds: float = 0.0

    @property
    def unstarted(self) -> np.ndarray:
        return np.isnan(self.first_start) & (self.excluded == INCLUDED)

    def waits(self) -> np.ndarray:
        """Queueing delay per job; NaN for excluded jobs."""
        return np.where(self.excluded == INCLUDED, self.queued_seconds, np.nan)

    def completion_times(self) -> np.ndarray:
        """Job completion time (end - submit) per job; NaN for excluded or unfinished jobs."""
        return self.end - self.jobs.submit


class FixedCluster:
    """The mutable state of one run; lists of Python numbers (fast to index one at a time). How queues are
    ordered and served is the scheduling policy's :class:`~dprobe.sim.fixed.scheduling.Strategy`."""

    def __init__(self, jobs: JobTable, policy: FixedQuotaPolicy, config: FixedConfig,
                 users: list[str] | None, t0: float) -> None:
        n_vcs, n = len(jobs.vc_names), len(jobs)
        self.config, self.sched, self.policy = config, config.scheduling, policy
        self.strategy = strategy_for(config.scheduling, n_vcs)
        self.size, self.vc, self.duration = jobs.gpus.tolist(), jobs.vc.tolist(), jobs.duration.tolist()
        self.users = users
        self.nodes = Nodes(config.gpus, config.gpus_per_node)
        self.q = [int(x) for x in policy.initial_quota()]
        self.used = [0] * n_vcs
        self.queued_gpus = [0] * n_vcs
        self.queues = [SortedJobs() for _ in range(n_vcs)]
        self.running: list[dict[int, None]] = [{} for _ in range(n_vcs)]  # in start order
        self.remaining = list(self.duration)  # work left (with restart costs), seconds
        self.run_start = [0.0] * n
        self.epoch = [0] * n  # bumped at every start and stop: stale heap events are skipped
        self.alloc: list[list[tuple[int, int]] | None] = [None] * n
        self.attained = [0.0] * n  # GPU-seconds received (Tiresias)
        self.base = [0.0] * n  # attained GPU-seconds when last promoted: the queue counts from there
        self.enqueued = [0.0] * n
        self.queued = [0.0] * n
        self.first_start = [math.nan] * n
        self.end = [math.nan] * n
        self.preempted = [0] * n
        self.estimate = [0.0] * n  # duration estimate at submission (qssf, easy)
        self.est_end = [0.0] * n
        self.estimator = DurationEstimator() if self.sched.uses_estimates else None
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, job or VC, epoch)
        self.idle_log = [deque([(t0, self.q[v])]) for v in range(n_vcs)]
        self.lend_cache = [(-math.inf, 0)] * n_vcs  # (valid until, lendable GPUs) per VC
        self.dirty: set[int] = set()
        self.waits_on_others = [False] * n_vcs  # its queue may move when GPUs free up anywhere
        self.freed = False
        self.used_area = [0.0] * n_vcs
        self.restart_area = 0.0
        self.reclaims = self.las_preempts = self.preemption_count = self.promotions = 0
        self.total_running = self.total_queued = 0
        if policy.lending and config.lend_delay > 0:  # the initial quotas, idle from the start
            heapq.heappush(self.events, (t0 + config.lend_delay, LENDABLE, 0, 0))

    # --- state changes ---------------------------------------------------------------------------
    def idle(self, v: int) -> int:
        return max(0, self.q[v] - self.used[v] - self.queued_gpus[v])

    def note_idle(self, v: int, now: float) -> None:
        """Record the VC's idle quota for the lending delay; a rise becomes lendable ``lend_delay`` later."""
        delay = self.config.lend_delay
        if not self.policy.lending or delay <= 0:
            return
        value, log = self.idle(v), self.idle_log[v]
        last = log[-1][1]
        if value == last:
            return
        if log[-1][0] == now:
            log[-1] = (now, value)
        else:
            log.append((now, value))
        self.lend_cache[v] = (-math.inf, 0)
        if value > last:
            heapq.heappush(self.events, (now + delay, LENDABLE, v, 0))

    def lendable(self, v: int, now: float) -> int:
        """GPUs of the VC idle for the whole of the last ``lend_delay`` seconds (cached until it can change:
        a new idle value, or the oldest one in the window leaving it)."""
        delay = self.config.lend_delay
        if delay <= 0:
            return self.idle(v)
        until, value = self.lend_cache[v]
        if now < until:
            return value
        log, since = self.idle_log[v], now - delay
        while len(log) >= 2 and log[1][0] <= since:
            log.popleft()
        if log[0][0] > since:
            value, until = 0, log[0][0] + delay
        else:
            value = min(v_ for _, v_ in log)
            until = log[1][0] + delay if len(log) >= 2 else math.inf
        self.lend_cache[v] = (until, value)
        return value

    def pool(self, now: float) -> int:
        """GPUs that may be lent now: lendable idle quota less what is already lent."""
        n_vcs = len(self.q)
        lent = sum(max(0, self.used[v] - self.q[v]) for v in range(n_vcs))
        return max(0, sum(self.lendable(v, now) for v in range(n_vcs)) - lent)

    def enqueue(self, j: int, now: float) -> None:
        v = self.vc[j]
        self.queues[v].push(j, self.strategy.key(self, j))
        self.queued_gpus[v] += self.size[j]
        self.enqueued[j] = now
        self.total_queued += 1
        self.dirty.add(v)
        self.note_idle(v, now)
        self.strategy.enqueued(self, j, now)

    def start(self, j: int, alloc: list[tuple[int, int]], now: float) -> None:
        v, size = self.vc[j], self.size[j]
        self.queues[v].remove(j)
        self.queued_gpus[v] -= size
        self.total_queued -= 1
        self.queued[j] += now - self.enqueued[j]
        if math.isnan(self.first_start[j]):
            self.first_start[j] = now
        self.alloc[j] = alloc
        self.run_start[j] = now
        self.used[v] += size
        self.running[v][j] = None
        self.total_running += 1
        self.epoch[j] += 1
        heapq.heappush(self.events, (now + self.remaining[j], FINISH, j, self.epoch[j]))
        if self.estimator is not None:
            done = self.duration[j] - self.remaining[j]
            self.est_end[j] = now + max(self.estimate[j] - done, 0.0)
        self.strategy.started(self, j, now)
        self.note_idle(v, now)

    def stop(self, j: int, now: float, release: bool = True) -> None:
        """A running job leaves its GPUs (finished or preempted)."""
        v, size = self.vc[j], self.size[j]
        ran = now - self.run_start[j]
        self.used_area[v] += size * ran
        self.attained[j] += size * ran
        self.remaining[j] -= ran
        if release:
            self.nodes.release(self._held(j))
        self.alloc[j] = None
        self.used[v] -= size
        del self.running[v][j]
        self.total_running -= 1
        self.epoch[j] += 1
        self.strategy.stopped(self, j)
        self.dirty.add(v)
        self.freed = True
        self.note_idle(v, now)

    def finish(self, j: int, now: float) -> None:
        self.stop(j, now)
        self.end[j] = now
        if self.estimator is not None:
            user = self.users[j] if self.users else None
            self.estimator.observe(user, self.vc[j], self.size[j], self.duration[j])

    def preempt(self, j: int, now: float, release: bool = True) -> None:
        self.stop(j, now, release)
        self.remaining[j] += self.config.restart_cost
        self.restart_area += self.config.restart_cost * self.size[j]
        self.preempted[j] += 1
        self.preemption_count += 1
        self.enqueue(j, now)

    def set_quota(self, quota: np.ndarray, now: float) -> tuple[int, list[int]]:
        """Apply a decision: the GPUs moved and the VCs whose quota changed."""
        changed = [v for v in range(len(self.q)) if int(quota[v]) != self.q[v]]
        moved = sum(abs(int(quota[v]) - self.q[v]) for v in changed) // 2
        for v in changed:
            self.q[v] = int(quota[v])
            self.note_idle(v, now)
        if changed:
            self.freed = True
            self.dirty.update(changed)
        return moved, changed

    # --- placement with preemption ---------------------------------------------------------------
    def place_preempting(self, victims: Iterable[int], gpus: int, now: float) -> list[tuple[int, int]] | None:
        """Place ``gpus`` after releasing victims one by one (in the order given) until it fits; the
        released victims are preempted only if it then fits, else put back where they ran."""
        released: list[int] = []
        for j in victims:
            self.nodes.release(self._held(j))
            released.append(j)
            alloc = self.nodes.place(gpus) if self.nodes.free >= gpus else None
            if alloc is not None:
                for r in released:
                    self.preempt(r, now, release=False)
                return alloc
        for r in released:
            self.nodes.take(self._held(r))
        return None

    def _held(self, j: int) -> list[tuple[int, int]]:
        """The GPUs running job ``j`` holds."""
        alloc = self.alloc[j]
        if alloc is None:
            raise RuntimeError(f"job {j} holds no GPUs: it is not running")
        return alloc

    def _lent_jobs(self, v: int) -> Iterator[int]:
        """Running jobs of the other VCs that hold GPUs beyond their quota, most recently started first,
        while their VC is still beyond it."""
        over = {u: self.used[u] - self.q[u] for u in range(len(self.q))
                if u != v and self.used[u] > self.q[u]}
        if not over:
            return
        newest = heapq.merge(*(reversed(list(self.running[u])) for u in over),
                             key=lambda j: -self.run_start[j])
        for j in newest:
            u = self.vc[j]
            if over[u] > 0:
                over[u] -= self.size[j]
                yield j

    def place_in_quota(self, v: int, gpus: int, now: float) -> list[tuple[int, int]] | None:
        """Place a job within its VC's quota, reclaiming lent GPUs by preemption where allowed."""
        alloc = self.nodes.place(gpus)
        if alloc is None and self.config.preempt:
            before = self.preemption_count
            alloc = self.place_preempting(self._lent_jobs(v), gpus, now)
            self.reclaims += self.preemption_count - before
        return alloc

    def borrow(self, v: int, gpus: int, lend: Borrowing) -> list[tuple[int, int]] | None:
        """Place a job that takes its VC beyond its quota, from the lending pool."""
        need = gpus - max(0, self.q[v] - self.used[v])
        if need > lend.pool or self.nodes.free - lend.reserved < gpus:
            return None
        alloc = self.nodes.place(gpus)
        if alloc is not None:
            lend.pool -= need
        return alloc

    # --- scheduling passes ------------------------------------------------------------------------
    def schedule(self, now: float) -> None:
        """Start (and for Tiresias, preempt) jobs in the VCs whose queues may move, by the strategy's pass."""
        n_vcs = len(self.q)
        todo = set(self.dirty)
        if self.freed:
            todo.update(v for v in range(n_vcs) if self.waits_on_others[v])
        self.dirty.clear()
        self.freed = False
        ready = sorted((v for v in todo if self.queues[v]), key=lambda v: self.queues[v].head())
        if not ready:
            return
        self.strategy.schedule(self, ready, now)
        for v in ready:
            waiting = self.policy.lending or self.waits_on_others[v]
            self.waits_on_others[v] = bool(self.queues[v]) and waiting


def simulate_fixed(jobs: JobTable, policy: FixedQuotaPolicy, config: FixedConfig,
                   users: list[str] | None = None, progress: bool = False) -> FixedResult:
    """Replay ``jobs`` on a cluster of ``config.gpus`` GPUs under a quota policy and a scheduling policy;
    returns when every job has finished or been excluded (or nothing can run for ``stall_seconds``).
    ``users``: each job's user, for QSSF's estimates (the bundled logs have none)."""
    if policy.total != config.gpus:
        raise ValueError(f"the quotas sum to {policy.total} GPUs, the cluster has {config.gpus}")
    if users is not None and len(users) != len(jobs):
        raise ValueError(f"{len(users)} users given for {len(jobs)} jobs")
    check_span(jobs, min(config.interval, policy.history_step or math.inf))
    began = time.perf_counter()
    n_vcs, n_jobs = len(jobs.vc_names), len(jobs)
    submit, job_vc = jobs.submit.tolist(), jobs.vc.tolist()
    most = [int(m) for m in policy.most_gpus()]
    t0 = submit[0] if n_jobs else 0.0
    c = FixedCluster(jobs, policy, config, users, t0)
    history = DemandHistory(n_vcs, policy.history_step) if policy.history_step else None
    excluded = np.zeros(n_jobs, dtype=np.int8)
    changes = np.zeros(n_vcs, dtype=np.int64)
    moved = 0
    decision_times: list[float] = []
    demand_log: list[list[int]] = []
    quota_log: list[list[int]] = []
    decisions = samples = i = 0
    next_decision = t0
    next_sample = t0 if history else math.inf
    last_progress = last_t = t0
    lent_area = 0.0
    lent_now = 0
    bar = progress_bar(f"{config.scheduling.name}/{policy.name}", (submit[-1] - t0) / DAY if n_jobs else 0.0,
                        progress)
    while True:
        if i >= n_jobs and c.total_running == 0:
            if c.total_queued == 0:
                end = last_progress
                break
            if next_decision - last_progress > config.stall_seconds:
                end = next_decision
                break
        now = min(c.events[0][0] if c.events else math.inf, submit[i] if i < n_jobs else math.inf,
                  next_sample, next_decision)
        lent_area += lent_now * (now - last_t)
        last_t = now
        while c.events and c.events[0][0] == now:
            _, kind, who, epoch = heapq.heappop(c.events)
            if kind == LENDABLE:
                c.freed = True
            elif epoch != c.epoch[who]:
                continue  # the run it was for has ended
            elif kind == FINISH:
                c.finish(who, now)
                last_progress = now
            else:  # the strategy's own (Tiresias: DEMOTE, PROMOTE)
                c.strategy.on_event(c, kind, who, now)
        while i < n_jobs and submit[i] == now:
            v, gpus = job_vc[i], c.size[i]
            if gpus > config.gpus:
                excluded[i] = OVER_CLUSTER
            elif gpus > most[v]:
                excluded[i] = OVER_VC
            else:
                if c.estimator is not None:
                    c.estimate[i] = c.estimator.estimate(users[i] if users else None, v, gpus)
                c.enqueue(i, now)
            last_progress = now
            i += 1
        if next_sample == now and history is not None:  # next_sample is inf without a history
            demand = [u + q for u, q in zip(c.used, c.queued_gpus, strict=True)]
            history.append(np.array([demand, [len(r) for r in c.running], [len(q) for q in c.queues], c.q],
                                    dtype=np.float64))
            samples += 1
            next_sample = t0 + samples * history.step_seconds
        if next_decision == now:
            demand = np.array(c.used) + np.array(c.queued_gpus)
            new = policy.decide(ClusterView(now=now, demand=demand, quota=np.array(c.q), history=history,
                                            held=np.array(c.used)))
            if new is not None:
                step, changed = c.set_quota(new, now)
                moved += step
                changes[changed] += 1
            if policy.lending:
                c.freed = True  # lending windows slide
            decision_times.append(now)
            demand_log.append(demand.tolist())
            quota_log.append(list(c.q))
            decisions += 1
            next_decision = t0 + decisions * config.interval
            bar.update(min(now - t0, bar.total * DAY) / DAY - bar.n)
        c.schedule(now)
        lent_now = sum(max(0, u - q) for u, q in zip(c.used, c.q, strict=True))
    bar.close()
    queued = np.array(c.queued)
    waiting = [j for queue in c.queues for j in queue]
    queued[waiting] += end - np.array(c.enqueued)[waiting]
    n_dec = len(decision_times)
    return FixedResult(
        scheduling=config.scheduling.name, quota=policy.name, jobs=jobs, gpus=config.gpus, excluded=excluded,
        first_start=np.array(c.first_start), end=np.array(c.end), queued_seconds=queued,
        preemptions=np.array(c.preempted, dtype=np.int64), end_time=end,
        used_gpu_seconds=np.array(c.used_area), restart_gpu_seconds=c.restart_area,
        lent_gpu_seconds=lent_area, reclaim_preemptions=c.reclaims, las_preemptions=c.las_preempts,
        promotions=c.promotions,
        quota_changes=changes, gpus_moved=moved,
        decision_times=np.array(decision_times),
        quota_at_decision=np.array(quota_log, dtype=np.int64).reshape(n_dec, n_vcs).T,
        demand_at_decision=np.array(demand_log, dtype=np.int64).reshape(n_dec, n_vcs).T,
        wall_seconds=time.perf_counter() - began,
    )
