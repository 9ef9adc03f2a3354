"""The scaler's decision state per scaled object: its recommender, its last decision, whether it was decided on
data yet (nothing is published before), the count it starts from, and its scale events."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Generic, TypeVar

from dprobe.services.scaler.policy import Decision, Policy, Recommender

K = TypeVar("K", bound=Hashable)


def parts(key: object) -> tuple[str, ...]:
    """A key's label values: ``(namespace, workload)`` for a workload, ``(vc,)`` for a virtual cluster."""
    return key if isinstance(key, tuple) else (str(key),)


def name(key: object) -> str:
    """A key as the logs show it: ``namespace/workload``, or the virtual cluster."""
    return "/".join(filter(None, parts(key)))


class Ledger(Generic[K]):
    """The state of one kind of scaled object (workloads, or virtual clusters), by key.

    ``decisions`` are the last cycle's (the service swaps in each cycle's at its end); ``published`` holds the
    objects decided on data (or by the fallback) at least once: their decisions are exported, and a
    recommend-mode decision starts from the last one, as if it had been followed.
    """

    def __init__(self) -> None:
        self.recommenders: dict[K, Recommender] = {}
        self.decisions: dict[K, Decision] = {}
        self.published: set[K] = set()
        self.events: Counter[tuple[str, ...]] = Counter()  # (*key, direction): decisions that changed a count
        self.restored: dict[K, int] = {}  # the recommendations of the scaler's last run (recommend mode)
        self.counted: dict[K, int] = {}  # the replicas kube-state-metrics shows (recommend mode)

    def recommender(self, key: K, policy: Callable[[], Policy]) -> Recommender:
        """The object's recommender, made with ``policy()`` the first time it is asked for."""
        if key not in self.recommenders:
            self.recommenders[key] = Recommender(policy())
        return self.recommenders[key]

    def start(self, key: K, observed: int) -> int:
        """The count a decision starts from when nothing sets it: the last recommendation once one has been made
        on data (or by the fallback), as if it had been followed; else the last run's (restored), else the
        replicas kube-state-metrics shows, else ``observed`` (the pods seen, a virtual cluster's GPUs held)."""
        previous = self.decisions.get(key)
        if previous is not None and key in self.published:
            return previous.replicas
        if key in self.restored:
            return self.restored[key]
        return self.counted.get(key, observed)

    def decide(self, now: float, key: K, demand: float | None, current: int, active: bool | None = None,
               missing: int = 0, covered: int = 0) -> Decision:
        """The object's recommender's decision; one on data (or the fallback) is published from then on."""
        decision = self.recommenders[key].decide(now, demand, current, active, missing, covered)
        if decision.demand is not None or decision.reason.startswith("fallback"):
            self.published.add(key)
        return replace(decision, published=key in self.published)

    def changed(self, key: K, decision: Decision) -> None:
        """Count a decision that changed the object's count, by direction."""
        self.events[(*filter(None, parts(key)), decision.direction)] += 1

    def not_applied(self, now: float, key: K, decision: Decision) -> None:
        """The decision's count could not be set: the object keeps the one it started from."""
        self.recommenders[key].applied(now, decision.replicas, decision.current)

    def forget(self, key: K) -> None:
        """An object that is gone (a discovered workload's pods, a virtual cluster's): forget it all."""
        del self.recommenders[key]
        self.published.discard(key)
        for direction in ("up", "down"):
            self.events.pop((*parts(key), direction), None)
