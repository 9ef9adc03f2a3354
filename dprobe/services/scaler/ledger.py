"""The scaler's decision state per scaled object: its recommender, its last decision, whether it was decided on
data yet (nothing is published before), the count it starts from, and its scale events."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Generic, TypeVar

from dprobe.scaling.policy import Decision, Policy, Recommender

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
    recommend-mode decision starts from the last one, as if it had been followed. ``restore_answered``: the
    last run's recommendations were read from Prometheus (or there is nothing to restore); until then a count
    that is neither restored, nor counted by kube-state-metrics, nor published is not known at all.
    """

    def __init__(self) -> None:
        self.recommenders: dict[K, Recommender] = {}
        self.decisions: dict[K, Decision] = {}
        self.published: set[K] = set()
        self.events: Counter[tuple[str, ...]] = Counter()  # (*key, direction): decisions that changed a count
        self.restored: dict[K, int] = {}  # the recommendations of the scaler's last run
        self.counted: dict[K, int] = {}  # the replicas kube-state-metrics shows
        self.restore_answered = False

    def recommender(self, key: K, policy: Callable[[], Policy]) -> Recommender:
        """The object's recommender, made with ``policy()`` the first time it is asked for."""
        if key not in self.recommenders:
            self.recommenders[key] = Recommender(policy())
        return self.recommenders[key]

    def start(self, key: K, observed: int) -> int | None:
        """The count a decision starts from when nothing sets it: the last recommendation once one has been made
        on data (or by the fallback), as if it had been followed; else the last run's (restored), else the
        replicas kube-state-metrics shows, else, once Prometheus has said there is no last recommendation,
        ``observed`` (the pods seen, a virtual cluster's GPUs held). None: not known yet (Prometheus has not
        answered since the start)."""
        previous = self.decisions.get(key)
        if previous is not None and key in self.published:
            return previous.replicas
        if key in self.restored:
            return self.restored[key]
        if key in self.counted:
            return self.counted[key]
        return observed if self.restore_answered else None

    def read(self, key: K) -> bool:
        """Whether the count :meth:`start` gives was read (published, restored, kube-state-metrics' replicas),
        rather than taken from the pods seen: only such a count may be raised by the fallback."""
        return key in self.published or key in self.restored or key in self.counted

    def unknown(self, demand: float | None) -> Decision:
        """The decision of an object whose count is not known yet: nothing published, nothing acted on, its
        recommender untouched (its windows start at its first decision from a known count)."""
        return Decision(0, 0, 0, demand, "count not known yet (no answer from Prometheus): holding",
                        published=False)

    def decide(self, now: float, key: K, demand: float | None, current: int, active: bool | None = None,
               missing: int = 0, covered: int = 0, read: bool = True) -> Decision:
        """The object's recommender's decision; one on data (or the fallback) is published from then on.
        ``read``: ``current`` was read (see :meth:`read`); only then may the fallback apply."""
        decision = self.recommenders[key].decide(now, demand, current, active, missing, covered, fallback=read)
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
        self.recommenders.pop(key, None)
        self.decisions.pop(key, None)
        self.restored.pop(key, None)
        self.published.discard(key)
        for direction in ("up", "down"):
            self.events.pop((*parts(key), direction), None)
