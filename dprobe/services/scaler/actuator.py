"""What a scaler does with its decisions, chosen once by ``mode``: ``recommend`` exports them only (KEDA, the HPA or
a person acts on them), ``apply`` also sets them through the Kubernetes API
(:class:`~dprobe.services.scaler.kube.KubernetesActuator`).

An actuator says where a listed workload's and a virtual cluster's decision starts from (the count set in the
cluster, or None: from the last recommendation, :meth:`Ledger.start <dprobe.services.scaler.ledger.Ledger.start>`)
and carries out a change. Discovered workloads are only ever recommended for. In either mode, what is only
recommended starts from the last run's recommendations (read back from Prometheus) and kube-state-metrics'
replicas and GPUs (:meth:`Actuator.prepare`); in recommend mode, a listed workload known by none of these starts
from its scale where Kubernetes lets the scaler read it (:meth:`Actuator.read_replicas`).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import Counter
from typing import Protocol

from dprobe.scaling.policy import Decision
from dprobe.services.scaler.config import WorkloadSpec
from dprobe.services.scaler.ledger import Ledger
from dprobe.services.scaler.reader import DemandReader

log = logging.getLogger(__name__)
UNREADABLE = (403, 404)  # the scale subresource forbidden (RBAC) or absent: not asked again


class ActuatorError(RuntimeError):
    """A count could not be read or set; the message names the object and the reason. ``stage``: where the
    scaler counts it (``dprobe_scaler_errors_total{stage}``); ``status``: the HTTP status, where an API server
    answered."""

    stage = "actuator"
    status: int | None = None


class Actuator(ABC):
    """Where decisions start from, and what becomes of them."""

    mode: str

    def prepare(self, reader: DemandReader, workloads: Ledger[tuple[str, str]], vcs: Ledger[str],
                now: float) -> None:
        """Once a cycle, after its demand was read (not when it could not be): read what the recommended counts
        start from. The last run's recommendations (and what its virtual clusters held) are read until
        Prometheus answers (once answered, not again), beneath what the last leader left; kube-state-metrics'
        replicas and GPUs every cycle. ``now``: the scaler's monotonic clock."""
        if not workloads.restore_answered:
            restored = reader.recommendations()
            if restored is not None:
                replicas, gpus, held = restored
                workloads.restore(replicas)
                vcs.restore(gpus)
                for vc, (n, age) in held.items():
                    vcs.held.setdefault(vc, (now - age, n))
                workloads.restore_answered = vcs.restore_answered = True
        workloads.counted = reader.replicas()
        vcs.counted = reader.vc_gpus()

    def read_replicas(self, spec: WorkloadSpec) -> int | None:
        """A listed workload's scale where it can be read though this actuator does not set it (recommend mode):
        where its count starts when nothing else says. None: not readable."""
        return None

    @abstractmethod
    def replicas(self, spec: WorkloadSpec) -> int | None:
        """The listed workload's count as set, or None: its decision starts from its last recommendation.
        Raises :class:`ActuatorError`."""

    @abstractmethod
    def scale(self, spec: WorkloadSpec, decision: Decision, demand: float | None) -> bool:
        """Carry out a decision that changes the listed workload's count (``demand``: what it was asked for);
        False when that failed (counted and logged here): the workload keeps its count."""

    @abstractmethod
    def gpus(self, vc: str) -> int | None:
        """The virtual cluster's GPUs as set, or None: its decision starts from its last recommendation.
        Raises :class:`ActuatorError`."""

    @abstractmethod
    def set_gpus(self, vc: str, decision: Decision, demand: float | None) -> bool:
        """Carry out a decision that changes the virtual cluster's GPUs, as :meth:`scale`."""


class ScaleReader(Protocol):
    """What :class:`RecommendActuator` reads: a workload's scale (a :class:`~dprobe.services.scaler.kube.ScaleClient`
    or a stand-in); it raises an :class:`ActuatorError` with the HTTP ``status`` where there is one."""

    def replicas(self, spec: WorkloadSpec) -> int: ...


class RecommendActuator(Actuator):
    """Recommend only: sets nothing. A decision starts from the last recommendation, as if it had been followed
    (as KEDA does when it scales on ``dprobe_recommended_replicas``); after a restart, from the last one
    Prometheus (or the Lease) kept; else from the workload's replicas as kube-state-metrics shows them, else, with
    ``scales`` (a kubeconfig, or in a cluster), its scale where RBAC allows a read; else it is not known. A
    virtual cluster: its GPUs as kube-state-metrics shows them (0 for one its answer leaves out), else it is not
    known."""

    mode = "recommend"

    def __init__(self, scales: ScaleReader | None = None, errors: Counter[str] | None = None) -> None:
        self.scales = scales
        self.errors = errors if errors is not None else Counter()
        self.unreadable: set[tuple[str, str]] = set()  # forbidden or absent: not asked again
        self._failure = ""

    def read_replicas(self, spec: WorkloadSpec) -> int | None:
        if self.scales is None or spec.key in self.unreadable:
            return None
        try:
            replicas = self.scales.replicas(spec)
        except ActuatorError as exc:
            if exc.status in UNREADABLE:
                self.unreadable.add(spec.key)
                log.info("%s: not readable, its count starts from kube-state-metrics or the last recommendation", exc)
            else:
                self.errors[exc.stage] += 1
                (log.warning if str(exc) != self._failure else log.debug)("%s (asked again next cycle)", exc)
                self._failure = str(exc)
            return None
        self._failure = ""
        return replicas

    def replicas(self, spec: WorkloadSpec) -> None:
        return None

    def scale(self, spec: WorkloadSpec, decision: Decision, demand: float | None) -> bool:
        return True

    def gpus(self, vc: str) -> None:
        return None

    def set_gpus(self, vc: str, decision: Decision, demand: float | None) -> bool:
        return True
