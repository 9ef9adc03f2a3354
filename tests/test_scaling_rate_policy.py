"""Rate policies of the scaling recommender in whole pods: a ``pods`` value that is not a whole number never
lets a period move more pods than it allows, up or down."""

from __future__ import annotations

from dprobe.scaling.policy import Policy, RatePolicy, Recommender, ScalingRules


def _recommender(**rules: ScalingRules) -> Recommender:
    return Recommender(Policy(target=1.0, margin=0.0, tolerance=0.0, min_replicas=0, max_replicas=50, **rules))


def test_a_fractional_pods_value_scales_down_at_most_that_many_pods_a_period() -> None:
    """1.5 pods a minute from 5 down to 1: one pod (5 - 1.5 = 3.5 rounds up to 4), not two (3)."""
    rec = _recommender(scale_down=ScalingRules(0.0, (RatePolicy("pods", 1.5, 60),)))
    d = rec.decide(0, 1.0, current=5)
    assert (d.replicas, d.reason) == (4, "scale-down limited by rate policy")
    assert rec.decide(30, 1.0, current=4).replicas == 4  # the minute's 1.5 pods: one pod moved, half a pod left
    assert rec.decide(61, 1.0, current=4).replicas == 3


def test_a_fractional_pods_value_scales_up_at_most_that_many_pods_a_period() -> None:
    """2.5 pods a minute from 4 up to 10: two pods (4 + 2.5 = 6.5 rounds down to 6)."""
    rec = _recommender(scale_up=ScalingRules(0.0, (RatePolicy("pods", 2.5, 60),)))
    d = rec.decide(0, 10.0, current=4)
    assert (d.replicas, d.reason) == (6, "scale-up limited by rate policy")


def test_whole_pods_and_percent_values_keep_their_limits() -> None:
    down = _recommender(scale_down=ScalingRules(0.0, (RatePolicy("pods", 2, 60),)))
    assert down.decide(0, 1.0, current=5).replicas == 3
    half = _recommender(scale_down=ScalingRules(0.0, (RatePolicy("percent", 50, 60),)))
    assert half.decide(0, 1.0, current=5).replicas == 3  # 50 % of 5, 2.5, floored: 2 pods
