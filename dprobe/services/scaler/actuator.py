"""What a scaler does with its decisions, chosen once by ``mode``: ``recommend`` exports them only (KEDA, the HPA or
a person acts on them), ``apply`` also sets them through the Kubernetes API
(:class:`~dprobe.services.scaler.kube.KubernetesActuator`).

An actuator says where a listed workload's and a virtual cluster's decision starts from (the count set in the
cluster, or None: from the last recommendation, :meth:`Ledger.start <dprobe.services.scaler.ledger.Ledger.start>`)
and carries out a change. Discovered workloads are only ever recommended for. In either mode, what is only
recommended starts from the last run's recommendations (read back from Prometheus) and kube-state-metrics'
replicas (:meth:`Actuator.prepare`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from dprobe.scaling.policy import Decision
from dprobe.services.scaler.config import WorkloadSpec
from dprobe.services.scaler.ledger import Ledger
from dprobe.services.scaler.reader import DemandReader


class ActuatorError(RuntimeError):
    """A count could not be read or set; the message names the object and the reason. ``stage``: where the
    scaler counts it (``dprobe_scaler_errors_total{stage}``)."""

    stage = "actuator"


class Actuator(ABC):
    """Where decisions start from, and what becomes of them."""

    mode: str

    def prepare(self, reader: DemandReader, workloads: Ledger[tuple[str, str]], vcs: Ledger[str]) -> None:
        """Once a cycle, after its demand was read (not when it could not be): read what the recommended counts
        start from. The last run's recommendations are read until Prometheus answers (once answered, not
        again); kube-state-metrics' replicas every cycle."""
        if not workloads.restore_answered:
            restored = reader.recommendations()
            if restored is not None:
                workloads.restored, vcs.restored = restored
                workloads.restore_answered = vcs.restore_answered = True
        workloads.counted = reader.replicas()

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


class RecommendActuator(Actuator):
    """Recommend only: no Kubernetes. A decision starts from the last recommendation, as if it had been
    followed (as KEDA does when it scales on ``dprobe_recommended_replicas``); after a restart, from the last
    one Prometheus kept; else from the workload's replicas as kube-state-metrics shows them, else the pods
    seen (a virtual cluster: the GPUs its pods hold)."""

    mode = "recommend"

    def replicas(self, spec: WorkloadSpec) -> None:
        return None

    def scale(self, spec: WorkloadSpec, decision: Decision, demand: float | None) -> bool:
        return True

    def gpus(self, vc: str) -> None:
        return None

    def set_gpus(self, vc: str, decision: Decision, demand: float | None) -> bool:
        return True
