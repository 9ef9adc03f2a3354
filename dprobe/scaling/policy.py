"""How a forecast demand becomes a replica (or GPU) count: the HPA's algorithm, fed by forecasts.

Per decision, for one scaled object (a workload's replicas, a virtual cluster's GPUs):

1. **Demand** is the forecast, at one horizon and quantile (VPA's percentile), summed over the
   object's pods: e.g. the p90 of GPU utilisation 5 minutes ahead, in pod-equivalents
   (a pod at 0.6 counts 0.6).
2. **Desired** is ``ceil(demand * (1 + margin) / target)`` (VPA's safety margin, the HPA's
   target utilisation), kept at the current count while ``demand / (current * target)`` is
   within ``tolerance`` of 1 (HPA; per direction, ``scale_up.tolerance`` above 1 and
   ``scale_down.tolerance`` below, as the HPA's ``behavior.*.tolerance``), set to 0 below
   ``activation`` where ``min_replicas`` is 0 (KEDA's activation threshold), and bounded by
   ``min_replicas`` / ``max_replicas``. A workload with an activation query (KEDA's trigger
   activation: a queue's length, a request rate) is woken from zero while the query is active and
   never sent to zero then; while it is inactive, a workload at zero stays there.
3. **Stabilisation** (HPA ``behavior``): a scale-down takes the highest desired count of the
   last ``scale_down.stabilization_seconds``, a scale-up the lowest of the last
   ``scale_up.stabilization_seconds`` (the count found at the first decision counts as desired then,
   as the HPA's initial recommendation: the highest count found before the first decision on data); then
   **rate policies** (``pods`` or ``percent`` per
   ``period_seconds``, the largest change allowed wins unless ``select: min``) bound the step.
4. **Missing data never lowers a count.** A pod the workload should have (its scale, kube-state-metrics'
   replicas, the last recommendation) but without a usable forecast counts as the HPA counts a pod without
   metrics: at ``target`` when the others ask for fewer replicas, at 0 when they ask for more; where that
   turns the direction round, the count is held. Below ``min_forecast_coverage`` of the expected pods with
   a forecast, the decision holds as if there were no forecast at all.
5. **Fallback** (KEDA, with ``currentReplicasIfHigher``): after ``failure_threshold`` decisions in a row
   without a forecast, the desired count is ``max(current, fallback_replicas)`` (unset: the current count is
   held), through the stabilisation windows and the scale-up rate policies like any other: a fallback
   never lowers a count, and never applies to a count that was never read (the service says which).

Where dprobe differs from the HPA: the input is a forecast ``horizon`` ahead, not the current
average, so the scale-up happens before the load arrives; demand is the sum over pods (pod-equivalents),
not their average, and the HPA's missing-pod rule is applied to that sum.

Times are seconds on any clock that never steps (the service passes ``time.monotonic()``, the simulator its
own time); :meth:`Recommender.snapshot` gives a recommender's state with ages instead of times, so that another
process (a restarted scaler, a new leader) resumes the same windows on its own clock (:meth:`Recommender.resume`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class RatePolicy:
    """At most ``value`` pods (or percent of the count at the period's start; up from 0, of 1) per
    ``period_seconds``."""

    type: Literal["pods", "percent"] = "percent"
    value: float = 100.0
    period_seconds: float = 15.0

    def __post_init__(self) -> None:
        if self.type not in ("pods", "percent"):
            raise ValueError(f"rate policy type must be pods or percent, got {self.type!r}")
        if self.value <= 0 or self.period_seconds <= 0:
            raise ValueError(f"rate policy value and period_seconds must be positive, got {self}")


@dataclass(frozen=True)
class ScalingRules:
    """One direction's behaviour, as the HPA's ``behavior.scaleUp`` / ``scaleDown``; ``tolerance``:
    this direction's own (None: the policy's)."""

    stabilization_seconds: float = 0.0
    policies: tuple[RatePolicy, ...] = (RatePolicy(),)
    select: Literal["max", "min", "disabled"] = "max"
    tolerance: float | None = None

    def __post_init__(self) -> None:
        if self.stabilization_seconds < 0:
            raise ValueError(f"stabilization_seconds must be >= 0, got {self.stabilization_seconds}")
        if self.tolerance is not None and not self.tolerance >= 0:
            raise ValueError(f"tolerance must be >= 0, got {self.tolerance}")
        if self.select not in ("max", "min", "disabled"):
            raise ValueError(f"select must be max, min or disabled, got {self.select!r}")


# the HPA's defaults: up at once by 100 % or 4 pods per 15 s; down after 5 min, by up to 100 % per 15 s
SCALE_UP_PODS = 4
DEFAULT_SCALE_UP = ScalingRules(0.0, (RatePolicy("percent", 100, 15), RatePolicy("pods", SCALE_UP_PODS, 15)),
                                "max")
DEFAULT_SCALE_DOWN = ScalingRules(300.0, (RatePolicy("percent", 100, 15),), "max")
# a virtual cluster's GPUs: the bounds of their recommendation (its policy's min and max replicas)
MIN_GPUS, MAX_GPUS = 0, 1024


@dataclass(frozen=True)
class Policy:
    """Everything that turns a demand into a count; one per scaled object."""

    target: float = 0.8  # demand one replica (GPU) should carry: utilisation 0-1 per replica
    margin: float = 0.1  # safety margin on the forecast demand (VPA)
    tolerance: float = 0.1  # no change while demand / capacity is within this of 1 (HPA); per direction below
    min_replicas: int = 1
    max_replicas: int = 100
    activation: float = 0.0  # with min_replicas 0: below this demand, scale to zero (KEDA)
    fallback_replicas: int | None = None  # after failure_threshold cycles without a forecast; None: hold
    failure_threshold: int = 3
    min_forecast_coverage: float = 0.5  # share of the expected pods with a forecast below which a decision holds
    scale_up: ScalingRules = field(default_factory=lambda: DEFAULT_SCALE_UP)
    scale_down: ScalingRules = field(default_factory=lambda: DEFAULT_SCALE_DOWN)

    def __post_init__(self) -> None:
        if self.target <= 0:
            raise ValueError(f"target must be positive, got {self.target}")
        if self.margin < 0 or self.tolerance < 0 or self.activation < 0:
            raise ValueError("margin, tolerance and activation must be >= 0")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 0 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")
        if not 0 <= self.min_forecast_coverage <= 1:
            raise ValueError(f"min_forecast_coverage must be between 0 and 1, got {self.min_forecast_coverage}")
        if self.failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {self.failure_threshold}")
        if self.fallback_replicas is not None and not (
                self.min_replicas <= self.fallback_replicas <= self.max_replicas):
            raise ValueError(f"fallback_replicas {self.fallback_replicas} is outside "
                             f"[{self.min_replicas}, {self.max_replicas}]")

    def desired(self, demand: float, current: int, active: bool | None = None, missing: int = 0) -> tuple[int, str]:
        """The count ``demand`` asks for (steps 2 and 4 above), before stabilisation, and why. ``active``: what a
        workload's activation query says (KEDA's trigger activation; None: it has none). An active
        workload is never recommended zero replicas; an inactive one at zero stays there. ``missing``: pods
        expected but without a forecast (the HPA's missing pods: at ``target`` on a scale-down, 0 on a scale-up;
        a direction they reverse holds the count)."""
        if not math.isfinite(demand) or demand < 0:
            raise ValueError(f"demand must be a finite number >= 0, got {demand}")
        if missing < 0:
            raise ValueError(f"missing must be >= 0, got {missing}")
        count, why = self._desired(demand, current, active)
        if missing and count < current:  # scaling down: the missing pods count as fully used
            count, why = self._desired(demand + missing * self.target, current, active)
            if count > current:
                return current, f"held: {missing} pods without a forecast"
            why = f"{why} ({missing} pods without a forecast counted at target)"
        return count, why

    def _desired(self, demand: float, current: int, active: bool | None) -> tuple[int, str]:
        if self.min_replicas == 0 and not active and (demand < self.activation or (active is False and current == 0)):
            return 0, "below activation"
        raw = math.ceil(demand * (1.0 + self.margin) / self.target - 1e-9)
        if active and current == 0:
            return self.bound(max(1, raw)), "activated"
        if current > 0:
            ratio = demand / (current * self.target)
            rules = self.scale_up if ratio > 1.0 else self.scale_down
            tolerance = self.tolerance if rules.tolerance is None else rules.tolerance
            if abs(ratio - 1.0) <= tolerance:
                return self.bound(current), "within tolerance"
        count = self.bound(raw)
        why = "forecast" if count == raw else ("at max_replicas" if raw > count else "at min_replicas")
        if active and count == 0:  # the forecast says idle, the activation query says otherwise
            return self.bound(1), "held by activation query"
        return count, why

    def bound(self, count: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, count))


# every default in one place: the scaler's options, the simulator's and a workload's own policy start here
DEFAULT_POLICY = Policy()


@dataclass(frozen=True)
class Decision:
    """One decision: the recommendation and what led to it."""

    replicas: int  # the recommendation
    desired: int  # what the demand alone asked for (before stabilisation and rate limits)
    current: int
    demand: float | None  # None: no forecast this cycle
    reason: str
    missing: int = 0  # pods (GPUs) expected but without a usable forecast
    published: bool = True  # False until the object's first decision on data (nothing is exported before)

    @property
    def direction(self) -> str:
        return "up" if self.replicas > self.current else "down" if self.replicas < self.current else "none"


def _staircase(entries: Iterable[tuple[float, int]]) -> list[tuple[float, int]]:
    """The ``(age, count)`` entries (oldest first) that can still be the highest or the lowest of a window of the
    most recent entries: the others never decide a stabilisation window again."""
    kept: list[tuple[float, int]] = []
    high, low = -math.inf, math.inf
    for age, count in reversed(list(entries)):
        if count > high or count < low:
            kept.append((age, count))
        high, low = max(high, count), min(low, count)
    return kept[::-1]


def _age(age: float) -> float:
    """An age as saved: rounded down to 10 ms (younger, never older: a window resumed from it ends no sooner)."""
    return math.floor(max(0.0, age) * 100) / 100


class Recommender:
    """The stateful part of a :class:`Policy`: stabilisation windows, rate limits and fallback.

    Call :meth:`decide` once per cycle with the time (seconds on a clock that never steps), the forecast demand
    (None where there was none) and the current count, a count read (never a guess: a count not known is no
    decision at all); report the count actually set with :meth:`applied` (the decision is taken as applied when
    not reported, as in a dry run). :meth:`snapshot` and :meth:`resume` carry the state to another process.
    """

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._desired: deque[tuple[float, int]] = deque()  # (time, desired count) for stabilisation
        self._changes: deque[tuple[float, int]] = deque()  # (time, signed change) for rate policies
        self._initial: tuple[float, int] | None = None  # (time, count) found at the first decision
        self._decided = False  # a decision on data (or the fallback) was made: the initial count is settled
        self.failures = 0

    def _horizon(self) -> float:
        """How far back an entry can still matter: the longest window or rate-policy period."""
        p = self.policy
        return max(p.scale_up.stabilization_seconds, p.scale_down.stabilization_seconds,
                   *(r.period_seconds for r in (*p.scale_up.policies, *p.scale_down.policies)))

    def snapshot(self, now: float) -> dict[str, Any]:
        """The state as JSON-able ages at ``now`` (seconds, so any clock can resume it): the desired counts that
        can still decide a stabilisation window, the rate policies' changes of their periods, the initial count,
        the failures in a row."""
        p = self.policy
        windows = max(p.scale_up.stabilization_seconds, p.scale_down.stabilization_seconds)
        period = max((r.period_seconds for r in (*p.scale_up.policies, *p.scale_down.policies)), default=0.0)
        state: dict[str, Any] = {
            "desired": [[_age(now - t), d] for t, d in _staircase((t, d) for t, d in self._desired
                                                                   if now - t <= windows)],
            "changes": [[_age(now - t), c] for t, c in self._changes if now - t < period],
            "failures": self.failures, "decided": self._decided}
        if self._initial is not None:
            state["initial"] = [_age(now - self._initial[0]), self._initial[1]]
        return state

    def resume(self, state: Mapping[str, Any], at: float) -> None:
        """Take up a :meth:`snapshot` taken at ``at`` on this recommender's clock (its ages count back from there).
        Raises ValueError for a state that is not one."""
        try:
            desired = sorted(((float(a), int(d)) for a, d in state.get("desired", [])), reverse=True)
            changes = sorted(((float(a), int(c)) for a, c in state.get("changes", [])), reverse=True)
            initial = state.get("initial")
            initial_at = None if initial is None else (at - max(0.0, float(initial[0])), int(initial[1]))
            failures, decided = int(state.get("failures", 0)), bool(state.get("decided", False))
        except (TypeError, ValueError, IndexError, AttributeError) as exc:
            raise ValueError(f"not a recommender's state: {exc}") from exc
        self._desired = deque((at - max(0.0, a), d) for a, d in desired)
        self._changes = deque((at - max(0.0, a), c) for a, c in changes)
        self._initial, self.failures, self._decided = initial_at, failures, decided

    def _window(self, now: float, seconds: float) -> list[int]:
        return [d for t, d in self._desired if now - t <= seconds]

    def _limit(self, now: float, current: int, rules: ScalingRules, up: bool) -> int | None:
        """The furthest count the rate policies allow from ``current`` (None: no limit)."""
        if rules.select == "disabled":
            return current
        bounds: list[int] = []
        for p in rules.policies:
            moved = sum(c for t, c in self._changes if now - t < p.period_seconds and (c > 0) == up)
            start = current - moved  # the count at the period's start
            # a percent of 0 would never raise a count from 0: up, it is a percent of at least 1
            step = p.value if p.type == "pods" else math.ceil(max(abs(start), 1) * p.value / 100.0) if up \
                else math.floor(abs(start) * p.value / 100.0)
            # whole pods within the policy (a fractional pods value: up to the count below, down to the
            # count above)
            bounds.append(math.floor(start + step) if up else math.ceil(start - step))
        if not bounds:
            return None
        pick = max if (rules.select == "max") == up else min
        return pick(bounds)

    def decide(self, now: float, demand: float | None, current: int, active: bool | None = None,
               missing: int = 0, covered: int | None = None, fallback: bool = True) -> Decision:
        """This cycle's decision; ``active``: the workload's activation query (see :meth:`Policy.desired`);
        ``missing``: pods expected but without a forecast, ``covered``: pods with one (their share below
        ``min_forecast_coverage`` holds the count, as no forecast does); ``fallback``: False where
        ``current`` was not read where it is set (a virtual cluster's GPUs its pods hold): the fallback then holds
        instead of raising a count it does not know.

        The count found at the first decision counts as a recommendation of that moment, as the HPA
        records one (``recordInitialRecommendation``): a new (or restarted) recommender scales down only
        after a full ``scale_down.stabilization_seconds``, so a restart cannot skip the window. Until its first
        decision on data (or the fallback), a higher count found raises it: a count first found too low (part
        of what runs) never opens the way down."""
        p = self.policy
        if self._initial is None:
            self._initial = (now, current)
        elif not self._decided and current > self._initial[1]:
            self._initial = (self._initial[0], current)
        horizon = self._horizon()
        while self._desired and now - self._desired[0][0] > horizon:
            self._desired.popleft()
        while self._changes and now - self._changes[0][0] > horizon:
            self._changes.popleft()
        expected = missing + (covered or 0)
        hold = "no forecast"
        if demand is not None and missing and covered is not None and covered < p.min_forecast_coverage * expected:
            demand, hold = None, f"forecasts for {covered} of {expected} pods"
        if demand is None:
            self.failures += 1
            if self.failures < p.failure_threshold or p.fallback_replicas is None or not fallback:
                return Decision(current, current, current, None, f"{hold}: holding", missing)
            desired = max(current, p.fallback_replicas)  # KEDA's currentReplicasIfHigher: never lower
            self._desired.append((now, desired))
            self._decided = True
            return self._step(now, current, desired, None, "fallback", missing)
        self.failures = 0
        self._decided = True
        desired, why = p.desired(demand, current, active, missing)
        self._desired.append((now, desired))
        return self._step(now, current, desired, demand, why, missing)

    def _step(self, now: float, current: int, desired: int, demand: float | None, why: str,
              missing: int) -> Decision:
        """From ``current`` towards ``desired`` (step 3 above): stabilisation windows, then rate policies."""
        p = self.policy
        target = desired
        if desired < current:  # the highest recent recommendation: no flapping down
            window = self._window(now, p.scale_down.stabilization_seconds)
            initial = self._initial  # set by the first decision
            if initial is not None and now - initial[0] < p.scale_down.stabilization_seconds:
                window.append(initial[1])
            target = max(window)
            limit = self._limit(now, current, p.scale_down, up=False)
            if target < current and limit is not None and target < limit:
                target, why = limit, "scale-down limited by rate policy"
            elif target > desired:
                why = "scale-down stabilised"
        elif desired > current:  # the lowest recent recommendation
            target = min(self._window(now, p.scale_up.stabilization_seconds))
            limit = self._limit(now, current, p.scale_up, up=True)
            if target > current and limit is not None and target > limit:
                target, why = limit, "scale-up limited by rate policy" if why != "fallback" else "fallback, rate-limited"
            elif target < desired:
                why = "scale-up stabilised" if why != "fallback" else "fallback, stabilised"
        target = min(max(target, min(current, desired)), max(current, desired))  # never past the desired count
        replicas = p.bound(int(target)) if target != current else current
        return self._commit(now, current, replicas, desired, demand, why, missing)

    def _commit(self, now: float, current: int, replicas: int, desired: int, demand: float | None,
                why: str, missing: int = 0) -> Decision:
        if replicas != current:
            self._changes.append((now, replicas - current))
        return Decision(replicas, desired, current, demand, why, missing)

    def applied(self, now: float, recommended: int, actual: int) -> None:
        """The count set differs from the recommendation (e.g. the apply failed): correct the record."""
        if actual != recommended and self._changes and self._changes[-1][0] == now:
            t, c = self._changes.pop()
            corrected = c - (recommended - actual)
            if corrected:
                self._changes.append((t, corrected))
