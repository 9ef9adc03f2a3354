"""The event-driven simulation of virtual clusters whose GPU quota a policy resets every interval.

Per VC: jobs arrive at their submit time asking for their GPUs for their duration and wait in the
VC's queue; a job starts when the VC's free quota (quota in service minus GPUs held by running jobs)
covers it. The queue is FIFO, or with backfill (the default) a later job that fits starts while the
head does not (Kueue's BestEffortFIFO; FIFO is its StrictFIFO). Every ``interval`` the policy sets
each VC's quota: an increase comes into service ``provision_delay`` seconds later (nodes take time to
come up), a decrease at once but without preempting anything (the GPUs are released as jobs finish).
A job bigger than the most the policy will ever give its VC is rejected on arrival.

GPUs provisioned at any moment are ``max(quota in service + quota coming up, GPUs held)``.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from dprobe.sim.jobs import DAY, JobTable
from dprobe.sim.policies import QuotaPolicy
from dprobe.sim.replay import check_span, progress_bar
from dprobe.sim.view import ClusterView, DemandHistory

FINISH, CAPACITY = 0, 1  # heap event kinds; at one instant finishes come first, then capacity


@dataclass(frozen=True)
class SimConfig:
    interval: float = 600.0  # seconds between policy decisions
    provision_delay: float = 300.0  # seconds before a quota increase is in service
    backfill: bool = True  # False: strict FIFO
    stall_seconds: float = 7 * DAY  # after the last submission, give up when nothing ran for this long

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval) and self.interval > 0):
            raise ValueError(f"--interval must be a positive number of seconds, got {self.interval:g}")
        if not (math.isfinite(self.provision_delay) and self.provision_delay >= 0):
            raise ValueError(f"--provision-delay must be >= 0 seconds, got {self.provision_delay:g}")


@dataclass
class SimResult:
    """What one policy did to one job log."""

    policy: str
    jobs: JobTable
    start: np.ndarray  # (N,) start time per job; NaN: rejected or never started
    rejected: np.ndarray  # (N,) bool
    end_time: float  # when the simulation stopped (the last job finished)
    provisioned_gpu_seconds: np.ndarray  # (V,) area under max(quota incl. coming up, GPUs held)
    used_gpu_seconds: np.ndarray  # (V,) area under GPUs held
    scale_events: np.ndarray  # (V,) decisions that changed the quota
    decision_times: np.ndarray  # (T,)
    demand_at_decision: np.ndarray  # (V, T) GPUs held + queued when deciding
    quota_at_decision: np.ndarray  # (V, T) quota set (incl. coming up) by the decision
    wall_seconds: float = 0.0

    @property
    def unstarted(self) -> np.ndarray:
        return np.isnan(self.start) & ~self.rejected

    def waits(self) -> np.ndarray:
        """Queueing delay per job (NaN for rejected ones); never-started jobs count until the end."""
        start = np.where(self.unstarted, self.end_time, self.start)
        return np.where(self.rejected, np.nan, start - self.jobs.submit)


class _Cluster:
    """The mutable per-VC state of one run; lists of Python numbers (fast to index one at a time)."""

    def __init__(self, jobs: JobTable, policy: QuotaPolicy, config: SimConfig, t0: float) -> None:
        n_vcs = len(jobs.vc_names)
        self.config = config
        self.size = jobs.gpus.tolist()
        self.duration = jobs.duration.tolist()
        self.start = [math.nan] * len(jobs)
        self.quota = [int(q) for q in policy.initial_quota()]  # in service
        self.coming: list[deque[list]] = [deque() for _ in range(n_vcs)]  # [arrival time, GPUs]
        self.coming_total = [0] * n_vcs
        self.held = [0] * n_vcs
        self.running = [0] * n_vcs
        self.queued_gpus = [0] * n_vcs
        self.queued_jobs = [0] * n_vcs
        self.queues: list[dict[int, deque[int]]] = [{} for _ in range(n_vcs)]  # size -> job indices
        self.events: list[tuple[float, int, int]] = []  # (time, kind, job or VC)
        self.last = [t0] * n_vcs
        self.provisioned = [0.0] * n_vcs
        self.used = [0.0] * n_vcs
        self.total_running = 0
        self.total_queued = 0

    def ordered(self, v: int) -> int:
        return self.quota[v] + self.coming_total[v]

    def advance(self, v: int, now: float) -> None:
        """Add the areas since the VC's last change (call before changing its state)."""
        dt = now - self.last[v]
        if dt <= 0:
            return
        held = self.held[v]
        self.provisioned[v] += max(self.ordered(v), held) * dt
        self.used[v] += held * dt
        self.last[v] = now

    def history_sample(self) -> np.ndarray:
        """Every VC's state now, in the order of ``dprobe.sim.view.HISTORY_SERIES``: ``(4, n_vcs)``."""
        demand = [h + q for h, q in zip(self.held, self.queued_gpus, strict=True)]
        ordered = [self.ordered(v) for v in range(len(self.held))]
        return np.array([demand, self.running, self.queued_jobs, ordered], dtype=np.float64)

    def submit(self, v: int, job: int, now: float) -> None:
        self.advance(v, now)
        size = self.size[job]
        queue = self.queues[v].get(size)
        if queue is None:
            queue = self.queues[v][size] = deque()
        queue.append(job)
        self.queued_gpus[v] += size
        self.queued_jobs[v] += 1
        self.total_queued += 1
        self.try_start(v, now)

    def finish(self, v: int, job: int, now: float) -> None:
        self.advance(v, now)
        self.held[v] -= self.size[job]
        self.running[v] -= 1
        self.total_running -= 1
        self.try_start(v, now)

    def try_start(self, v: int, now: float) -> None:
        """Start queued jobs that the free quota covers: the head only (FIFO) or any (backfill)."""
        free = self.quota[v] - self.held[v]
        queues = self.queues[v]
        while free > 0 and queues:
            pick = -1
            for size, queue in queues.items():  # the earliest submitted head (of those that fit)
                if (self.config.backfill and size > free) or (pick >= 0 and queue[0] > pick):
                    continue
                pick = queue[0]
            if pick < 0 or self.size[pick] > free:
                break
            size = self.size[pick]
            queues[size].popleft()
            if not queues[size]:
                del queues[size]
            self.start[pick] = now
            free -= size
            self.held[v] += size
            self.running[v] += 1
            self.queued_gpus[v] -= size
            self.queued_jobs[v] -= 1
            self.total_running += 1
            self.total_queued -= 1
            heapq.heappush(self.events, (now + self.duration[pick], FINISH, pick))

    def set_quota(self, v: int, new: int, now: float) -> bool:
        """Order ``new`` GPUs of quota: increases arrive after the delay, decreases cancel GPUs still
        coming up first, then take effect at once (no preemption). True if the quota changed."""
        new = max(0, new)
        ordered = self.ordered(v)
        if new == ordered:
            return False
        self.advance(v, now)
        if new > ordered:
            if self.config.provision_delay <= 0:
                self.quota[v] += new - ordered
                self.try_start(v, now)
            else:
                at = now + self.config.provision_delay
                self.coming[v].append([at, new - ordered])
                self.coming_total[v] += new - ordered
                heapq.heappush(self.events, (at, CAPACITY, v))
            return True
        cut = ordered - new
        coming = self.coming[v]
        while cut and coming:  # the newest orders are cancelled first
            take = min(cut, coming[-1][1])
            coming[-1][1] -= take
            self.coming_total[v] -= take
            cut -= take
            if coming[-1][1] == 0:
                coming.pop()
        self.quota[v] -= cut
        return True

    def capacity_arrives(self, v: int, now: float) -> None:
        self.advance(v, now)
        coming = self.coming[v]
        while coming and coming[0][0] <= now:
            _, gpus = coming.popleft()
            self.quota[v] += gpus
            self.coming_total[v] -= gpus
        self.try_start(v, now)


def simulate(jobs: JobTable, policy: QuotaPolicy, config: SimConfig | None = None,
             progress: bool = False) -> SimResult:
    """Replay ``jobs`` under ``policy``; returns when every job has finished (or been rejected).
    A ValueError (:func:`~dprobe.sim.replay.check_span`) for a log that would take more than ``MAX_STEPS`` steps."""
    config = config or SimConfig()
    check_span(jobs, min(config.interval, policy.history_step or math.inf))
    began = time.perf_counter()
    n_vcs, n_jobs = len(jobs.vc_names), len(jobs)
    submit, job_vc = jobs.submit.tolist(), jobs.vc.tolist()
    max_gpus = [int(m) for m in policy.max_gpus]
    t0 = submit[0] if n_jobs else 0.0
    cluster = _Cluster(jobs, policy, config, t0)
    history = DemandHistory(n_vcs, policy.history_step) if policy.history_step else None
    rejected = np.zeros(n_jobs, dtype=bool)
    scale_events = np.zeros(n_vcs, dtype=np.int64)
    decision_times: list[float] = []
    demand_log: list[list[int]] = []
    quota_log: list[list[int]] = []
    decisions = samples = 0
    next_decision = t0
    next_sample = t0 if history else math.inf
    last_progress = t0  # the last finish, or the last submission
    i = 0
    bar = progress_bar(policy.name, (submit[-1] - t0) / DAY if n_jobs else 0.0, progress)
    while True:
        if i >= n_jobs and cluster.total_running == 0:
            if cluster.total_queued == 0:
                end = last_progress  # every job finished or was rejected
                break
            if next_decision - last_progress > config.stall_seconds:
                end = next_decision  # the jobs still queued would never start
                break
        t_event = cluster.events[0][0] if cluster.events else math.inf
        t_submit = submit[i] if i < n_jobs else math.inf
        now = min(t_event, t_submit, next_sample, next_decision)
        if t_event == now:
            _, kind, who = heapq.heappop(cluster.events)
            if kind == FINISH:
                cluster.finish(job_vc[who], who, now)
                last_progress = now
            else:
                cluster.capacity_arrives(who, now)
        elif next_sample == now and history is not None:  # next_sample is inf without a history
            history.append(cluster.history_sample())
            samples += 1
            next_sample = t0 + samples * history.step_seconds
        elif next_decision == now:
            demand = np.array(cluster.held) + np.array(cluster.queued_gpus)
            ordered = np.array([cluster.ordered(v) for v in range(n_vcs)])
            view = ClusterView(now=now, demand=demand, quota=ordered, history=history)
            new_quota = policy.decide(view)
            for v in range(n_vcs):
                if cluster.set_quota(v, int(new_quota[v]), now):
                    scale_events[v] += 1
            decision_times.append(now)
            demand_log.append(demand.tolist())
            quota_log.append([cluster.ordered(v) for v in range(n_vcs)])
            decisions += 1
            next_decision = t0 + decisions * config.interval
            bar.update(min(now - t0, bar.total * DAY) / DAY - bar.n)
        else:
            v = job_vc[i]
            if cluster.size[i] > max_gpus[v]:
                rejected[i] = True
            else:
                cluster.submit(v, i, now)
            last_progress = max(last_progress, now)
            i += 1
    bar.close()
    for v in range(n_vcs):
        cluster.advance(v, end)
    return SimResult(
        policy=policy.name, jobs=jobs, start=np.array(cluster.start, dtype=np.float64), rejected=rejected,
        end_time=end, provisioned_gpu_seconds=np.array(cluster.provisioned),
        used_gpu_seconds=np.array(cluster.used), scale_events=scale_events,
        decision_times=np.array(decision_times),
        demand_at_decision=np.array(demand_log, dtype=np.int64).reshape(len(decision_times), n_vcs).T,
        quota_at_decision=np.array(quota_log, dtype=np.int64).reshape(len(decision_times), n_vcs).T,
        wall_seconds=time.perf_counter() - began,
    )
