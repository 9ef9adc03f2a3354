"""The scaler's decision state per scaled object: its recommender, its last decision, whether it was decided on
data yet (nothing is published before), the count it starts from (read, never guessed), what it held at its last
decision on data, and its scale events; and that state as saved for a restarted scaler or the next leader."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import replace
from typing import Any, Generic, TypeVar

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
    recommend-mode decision starts from the last one, as if it had been followed. A count is *read*: restored
    (the last run's recommendation, from Prometheus, or the last leader's, from the Lease), counted
    (kube-state-metrics), or set in the cluster (the actuator's); a count read by none is not known, never the
    pods seen. ``restore_answered``: the last run's recommendations were read from Prometheus (or there is
    nothing to restore). ``held``: when the object's last decision on data was made (the service's monotonic
    clock) and the pods (a virtual cluster's GPUs) it held then.
    """

    def __init__(self) -> None:
        self.recommenders: dict[K, Recommender] = {}
        self.decisions: dict[K, Decision] = {}
        self.published: set[K] = set()
        self.events: Counter[tuple[str, ...]] = Counter()  # (*key, direction): decisions that changed a count
        self.restored: dict[K, int] = {}  # the recommendations of the scaler's last run (or the last leader's)
        self.counted: dict[K, int] = {}  # kube-state-metrics: a workload's replicas, a virtual cluster's GPUs
        self.held: dict[K, tuple[float, int]] = {}  # (time of the last decision on data, pods or GPUs held then)
        self.read_once: set[K] = set()  # decided at least once from a count read (not only from the pods seen)
        self.restore_answered = False

    def recommender(self, key: K, policy: Callable[[], Policy]) -> Recommender:
        """The object's recommender, made with ``policy()`` the first time it is asked for."""
        if key not in self.recommenders:
            self.recommenders[key] = Recommender(policy())
        return self.recommenders[key]

    def start(self, key: K) -> int | None:
        """The count a decision starts from when nothing sets it: the last recommendation once one has been made
        on data (or by the fallback), as if it had been followed; else the last run's (restored), else the count
        kube-state-metrics shows. None: not known (never the pods seen)."""
        previous = self.decisions.get(key)
        if previous is not None and key in self.published:
            return previous.replicas
        if key in self.restored:
            return self.restored[key]
        return self.counted.get(key)

    def read(self, key: K) -> bool:
        """Whether the count :meth:`start` gives was read (restored, kube-state-metrics', or published from such
        a count), rather than found in the GPUs a virtual cluster's pods hold: only such a count may be raised by
        the fallback, or lowered below what the pods hold."""
        return key in self.read_once or key in self.restored or key in self.counted

    def unknown(self, demand: float | None) -> Decision:
        """The decision of an object whose count is not known yet: nothing published, nothing acted on, its
        recommender untouched (its windows start at its first decision from a known count)."""
        return Decision(0, 0, 0, demand, "count not known yet (no replicas, scale or earlier recommendation "
                                         "read): holding", published=False)

    def decide(self, now: float, key: K, demand: float | None, current: int, active: bool | None = None,
               missing: int = 0, covered: int = 0, read: bool = True, floor: int = 0) -> Decision:
        """The object's recommender's decision; one on data (or the fallback) is published from then on.
        ``read``: ``current`` was read (see :meth:`read`); only then may the fallback apply. ``floor``: the count
        the decision may not go below (a count not read: what the pods hold)."""
        recommender = self.recommenders[key]
        decision = recommender.decide(now, demand, current, active, missing, covered, fallback=read)
        if read:
            self.read_once.add(key)
        if decision.replicas < floor:
            recommender.applied(now, decision.replicas, floor)
            decision = replace(decision, replicas=floor,
                               reason=f"{decision.reason}; held at the {floor} its pods hold (no count read)")
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
        self.held.pop(key, None)
        self.published.discard(key)
        self.read_once.discard(key)
        for direction in ("up", "down"):
            self.events.pop((*parts(key), direction), None)

    # what survives a restart or a change of leader ------------------------------------------------------------
    def snapshot(self, now: float) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
        """Each object whose count is known, as ``(label values, state)``: its count (the last published
        decision, else the restored one), whether it was published, its recommender's state and what it held at
        its last decision on data, times as ages at ``now`` (see :meth:`resume`)."""
        for key in sorted({*self.published, *self.restored, *self.held}, key=parts):
            previous = self.decisions.get(key)
            count = previous.replicas if previous is not None and key in self.published else self.restored.get(key)
            state: dict[str, Any] = {"published": key in self.published}
            if count is not None:
                state["count"] = count
            recommender = self.recommenders.get(key)
            if count is not None and recommender is not None:
                state["recommender"] = recommender.snapshot(now)
            if key in self.held:
                at, n = self.held[key]
                state["held"] = [max(0.0, now - at), n]
            if len(state) > 1:
                yield parts(key), state

    def resume(self, key: K, state: Mapping[str, Any], at: float, policy: Callable[[], Policy]) -> None:
        """Take up one object's :meth:`snapshot` state, taken at ``at`` on this scaler's clock: its count becomes
        the restored one, its windows go on where they were. Raises ValueError for a state that is not one."""
        try:
            count = state.get("count")
            held = state.get("held")
            held_at = None if held is None else (at - max(0.0, float(held[0])), int(held[1]))
            count = None if count is None else int(count)
        except (TypeError, ValueError, IndexError, AttributeError) as exc:
            raise ValueError(f"{name(key)}: not a saved state: {exc}") from exc
        if count is not None and count >= 0:
            self.restored[key] = count
            if state.get("published") is True:
                self.published.add(key)
            if isinstance(state.get("recommender"), Mapping):
                self.recommender(key, policy).resume(state["recommender"], at)
        if held_at is not None:
            self.held[key] = held_at

    def restore(self, restored: Mapping[K, int]) -> None:
        """The last run's recommendations read from Prometheus, beneath what the last leader left in the Lease
        (:meth:`resume`), the later of the two."""
        self.restored = {**restored, **self.restored}
