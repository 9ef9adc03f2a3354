"""The scaler: its policy (HPA / KEDA / VPA semantics), config, demand grouping, service and apply mode."""

from __future__ import annotations

import json
import math
import re
import ssl
import subprocess
import sys
import threading
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dprobe.scaling.policy import Policy, RatePolicy, Recommender, ScalingRules
from dprobe.services.scaler.config import ScalerConfig, WorkloadSpec, load_config
from dprobe.services.scaler.demand import forecast_query, group_demand
from dprobe.services.scaler.kube import KubernetesError, ScaleClient
from dprobe.services.scaler.service import Scaler

ROOT = Path(__file__).resolve().parents[1]
NO_LIMIT = ScalingRules(0.0, (RatePolicy("percent", 1000, 15),))


# policy -------------------------------------------------------------------------------------------
def test_desired_count_is_the_hpa_formula_on_the_forecast() -> None:
    p = Policy(target=0.5, margin=0.0, tolerance=0.1, min_replicas=1, max_replicas=10)
    assert p.desired(1.8, current=2) == (4, "forecast")  # ceil(1.8 / 0.5)
    assert p.desired(1.05, current=2) == (2, "within tolerance")  # 1.05 / (2 * 0.5) = 1.05
    assert p.desired(30.0, current=2) == (10, "at max_replicas")
    assert p.desired(0.0, current=2) == (1, "at min_replicas")
    assert Policy(target=0.5, margin=0.2, tolerance=0.0).desired(1.0, current=1) == (3, "forecast")  # 1.2/0.5
    zero = Policy(min_replicas=0, activation=0.05)
    assert zero.desired(0.01, current=3) == (0, "below activation")
    assert zero.desired(0.06, current=0)[0] == 1
    with pytest.raises(ValueError, match="demand"):
        p.desired(float("nan"), current=1)


def test_activation_query_wakes_from_zero_and_holds_off_zero_as_kedas_activation() -> None:
    p = Policy(target=0.5, margin=0.0, min_replicas=0, max_replicas=8, activation=0.05)
    assert p.desired(0.0, current=0, active=True) == (1, "activated")  # no pods yet: one to start with
    assert p.desired(1.8, current=0, active=True) == (4, "activated")  # pods already forecast: as many as asked
    assert p.desired(0.0, current=0, active=False) == (0, "below activation")
    assert p.desired(0.9, current=0, active=False) == (0, "below activation")  # inactive at zero stays there
    assert p.desired(0.0, current=2, active=True) == (1, "held by activation query")  # never to zero while active
    assert p.desired(0.01, current=2, active=False) == (0, "below activation")
    assert p.desired(0.01, current=2) == (0, "below activation")  # no activation query: as before
    rec = Recommender(p)  # the scale-down to zero waits for the stabilisation window: KEDA's cooldown
    assert rec.decide(0, 0.0, current=0, active=True).replicas == 1
    assert rec.decide(30, 0.0, current=1, active=False).replicas == 1
    assert rec.decide(331, 0.0, current=1, active=False).replicas == 0


def test_tolerance_per_direction_as_the_hpas_behavior_tolerance() -> None:
    # capacity 2 x 0.5 = 1.0: demand 1.05 is 5 % above it, 0.95 is 5 % below
    eager_up = Policy(target=0.5, margin=0.0, tolerance=0.1, scale_up=ScalingRules(tolerance=0.0))
    assert eager_up.desired(1.05, current=2) == (3, "forecast")  # ceil(1.05 / 0.5): up at once
    assert eager_up.desired(0.95, current=2) == (2, "within tolerance")  # down keeps the policy's 10 %
    assert eager_up.desired(0.85, current=2) == (2, "forecast")  # 15 % below: ceil(1.7) = 2
    lazy_down = Policy(target=0.5, margin=0.0, tolerance=0.0, scale_down=ScalingRules(tolerance=0.5))
    assert lazy_down.desired(0.6, current=2) == (2, "within tolerance")  # 40 % below: held
    assert lazy_down.desired(0.4, current=2) == (1, "forecast")  # 60 % below
    assert lazy_down.desired(1.05, current=2) == (3, "forecast")
    with pytest.raises(ValueError, match="tolerance must be >= 0"):
        ScalingRules(tolerance=-0.1)


def test_policy_refuses_inconsistent_settings() -> None:
    with pytest.raises(ValueError, match="min_replicas"):
        Policy(min_replicas=5, max_replicas=2)
    with pytest.raises(ValueError, match="fallback_replicas"):
        Policy(min_replicas=1, max_replicas=4, fallback_replicas=9)
    with pytest.raises(ValueError, match="target"):
        Policy(target=0)
    with pytest.raises(ValueError, match="rate policy type"):
        RatePolicy("nodes", 1, 15)


def test_scale_down_waits_for_the_stabilisation_window_scale_up_does_not() -> None:
    rules_down = ScalingRules(300.0, (RatePolicy("percent", 100, 15),))
    rec = Recommender(Policy(target=1.0, margin=0.0, tolerance=0.0, scale_up=NO_LIMIT, scale_down=rules_down))
    assert rec.decide(0, 6.0, current=2).replicas == 6  # up at once
    d = rec.decide(60, 2.0, current=6)
    assert (d.replicas, d.desired, d.reason) == (6, 2, "scale-down stabilised")  # 6 was asked 60 s ago
    assert rec.decide(200, 3.0, current=6).replicas == 6
    d = rec.decide(301, 2.0, current=6)  # the 6 left the window; 3 (t=200) is now the highest
    assert (d.replicas, d.direction) == (3, "down")
    assert rec.decide(501, 2.0, current=3).replicas == 2


def test_a_new_recommender_scales_down_only_after_a_full_window_as_the_hpa() -> None:
    """The count found at the first decision is a recommendation of that moment (the HPA's initial
    recommendation): a restarted scaler cannot skip the scale-down window, and scale-ups are not held."""
    rules_down = ScalingRules(300.0, (RatePolicy("percent", 100, 15),))
    policy = Policy(target=1.0, margin=0.0, tolerance=0.0, scale_up=NO_LIMIT, scale_down=rules_down)
    rec = Recommender(policy)
    d = rec.decide(1000, 2.0, current=8)
    assert (d.replicas, d.desired, d.reason) == (8, 2, "scale-down stabilised")
    assert rec.decide(1299, 2.0, current=8).replicas == 8
    assert rec.decide(1300, 2.0, current=8).replicas == 2  # a full window after the first decision
    assert Recommender(policy).decide(1000, 12.0, current=8).replicas == 12  # up at once
    no_window = ScalingRules(0.0, (RatePolicy("percent", 100, 15),))
    assert Recommender(replace(policy, scale_down=no_window)).decide(0, 2.0, current=8).replicas == 2


def test_a_recommender_resumes_its_windows_on_another_clock_and_its_first_count_is_the_highest_found() -> None:
    """A snapshot holds ages, not times: resumed on a clock 10,000 s apart, 40 s later, the windows and the rate
    policies' periods go on (the rate limit of the period spent, the scale-down when it would have come),
    and a state that is not one is refused. Before its first decision on data, a higher count found raises the
    initial count (4 seen first, then 11: no scale-down below 11 within the window)."""
    down = ScalingRules(300.0, (RatePolicy("percent", 100, 15),))
    up = ScalingRules(0.0, (RatePolicy("pods", 2, 60),))
    policy = Policy(target=1.0, margin=0.0, tolerance=0.0, max_replicas=20, scale_up=up, scale_down=down)
    rec, moved = Recommender(policy), Recommender(policy)
    assert [rec.decide(t, d, current=c).replicas for t, d, c in ((0, 8.0, 8), (30, 8.0, 8), (60, 2.0, 8))] == [8] * 3
    assert rec.decide(90, 12.0, current=8).replicas == 10  # 2 pods a minute
    moved.resume(json.loads(json.dumps(rec.snapshot(100))), at=10_100 + 40)  # taken at 100, resumed 40 s later
    for r, offset in ((rec, 0), (moved, 10_040)):
        assert r.decide(140 + offset, 12.0, current=10).replicas == 10  # the minute's 2 pods spent
        assert [r.decide(t + offset, 2.0, current=10).replicas for t in (439, 441)] == [10, 2]  # 441 - 140 > 300
    with pytest.raises(ValueError, match="not a recommender's state"):
        moved.resume({"desired": [["soon", 3]]}, at=0)
    first = Recommender(policy)
    assert first.decide(0, None, current=4).replicas == 4  # part of what runs, no forecast: held
    d = first.decide(30, 3.0, current=11)
    assert (d.replicas, d.reason) == (11, "scale-down stabilised")
    assert first.decide(299, 3.0, current=11).replicas == 11 and first.decide(300, 3.0, current=11).replicas == 3


def test_rate_policies_bound_each_period_and_select_max_or_min() -> None:
    one_pod = ScalingRules(0.0, (RatePolicy("pods", 1, 60),))
    rec = Recommender(Policy(target=1.0, margin=0.0, tolerance=0.0, max_replicas=50, scale_up=one_pod))
    d = rec.decide(0, 10.0, current=2)
    assert (d.replicas, d.desired, d.reason) == (3, 10, "scale-up limited by rate policy")
    assert rec.decide(30, 10.0, current=3).replicas == 3  # the period's one pod is spent
    assert rec.decide(61, 10.0, current=3).replicas == 4
    percent_only = Policy(target=1.0, margin=0.0, tolerance=0.0, min_replicas=0, max_replicas=100,
                          scale_up=ScalingRules(0.0, (RatePolicy("percent", 100, 15),)))
    rec = Recommender(percent_only)  # up from 0, 100 % of at least 1: one, then doubling each period
    assert [rec.decide(t, 6.0, current=c).replicas for t, c in ((0, 0), (16, 1), (32, 2), (48, 4))] == [1, 2, 4, 6]
    both = (RatePolicy("pods", 4, 15), RatePolicy("percent", 100, 15))  # the HPA's default scale-up
    fast = Recommender(Policy(target=1.0, margin=0.0, tolerance=0.0, max_replicas=100,
                              scale_up=ScalingRules(0.0, both, "max")))
    assert fast.decide(0, 50.0, current=10).replicas == 20  # max(10 + 4, 10 * 2)
    slow = Recommender(Policy(target=1.0, margin=0.0, tolerance=0.0, max_replicas=100,
                              scale_up=ScalingRules(0.0, both, "min")))
    assert slow.decide(0, 50.0, current=10).replicas == 14
    frozen = Recommender(Policy(target=1.0, margin=0.0, tolerance=0.0,
                                scale_down=ScalingRules(0.0, (RatePolicy(),), "disabled")))
    assert frozen.decide(0, 1.0, current=5).replicas == 5


def test_fallback_after_failure_threshold_cycles_without_forecast() -> None:
    rec = Recommender(Policy(fallback_replicas=4, failure_threshold=3, scale_up=NO_LIMIT))
    assert [rec.decide(t, None, current=2).replicas for t in (0, 30)] == [2, 2]  # holding
    d = rec.decide(60, None, current=2)
    assert (d.replicas, d.reason) == (4, "fallback")
    assert rec.decide(90, 0.8 * 2, current=4).reason != "fallback"  # forecasts back: normal decisions
    hold = Recommender(Policy(failure_threshold=1))
    assert hold.decide(0, None, current=7).replicas == 7  # no fallback set: hold


def test_fallback_never_lowers_a_count_and_goes_through_rate_policies() -> None:
    """KEDA's ``currentReplicasIfHigher``: the fallback is max(current, fallback_replicas); a raise to it is
    bounded by the scale-up rate policies, and the scale-down after the forecasts return is stabilised."""
    rec = Recommender(Policy(fallback_replicas=2, failure_threshold=2, max_replicas=20))
    assert [rec.decide(t, None, current=6).replicas for t in (0, 30, 60)] == [6, 6, 6]  # not 6 -> 2
    assert rec.decide(60, None, current=6).reason == "fallback"
    up = Recommender(Policy(fallback_replicas=12, failure_threshold=1, max_replicas=20,
                            scale_up=ScalingRules(0.0, (RatePolicy("pods", 2, 60),))))
    steps = [up.decide(t, None, current=c) for t, c in ((0, 3), (30, 5), (90, 5), (150, 7))]
    assert [d.replicas for d in steps] == [5, 5, 7, 9]  # 2 pods a minute towards 12
    assert steps[0].reason == "fallback, rate-limited"
    back = up.decide(180, 0.1, current=9)  # forecasts back and low: down only after the stabilisation window
    assert (back.replicas, back.reason) == (9, "scale-down stabilised")


def test_missing_pods_count_as_the_hpa_counts_them() -> None:
    """A pod expected but without a forecast counts at target on a scale-down and at 0 on a scale-up; where
    that reverses the direction, the count is held; below min_forecast_coverage, the count is held."""
    p = Policy(target=0.5, margin=0.0, tolerance=0.0, max_replicas=20)
    # 4 pods expected, 1 forecast at 0.1: alone it asks for 1; with 3 missing at 0.5 each, ceil(1.6 / 0.5) = 4
    assert p.desired(0.1, current=4, missing=3)[0] == 4
    # 1 of 2 forecast at 0.2: ceil((0.2 + 0.5) / 0.5) = 2, not 1
    assert p.desired(0.2, current=2, missing=1)[0] == 2
    # scaling up: missing pods count 0 (the forecast pods alone ask for more)
    assert p.desired(3.0, current=4, missing=2)[0] == 6
    # a scale-down the missing pods would turn into a scale-up is held
    count, why = p.desired(0.9, current=3, missing=2)  # alone ceil(1.8) = 2; with them ceil(3.8) = 4
    assert count == 3 and why == "held: 2 pods without a forecast"
    rec = Recommender(replace(p, scale_down=NO_LIMIT, min_forecast_coverage=0.5, failure_threshold=5))
    d = rec.decide(0, 0.1, current=4, missing=3, covered=1)  # 1 of 4 forecast: below half, held
    assert (d.replicas, d.demand, d.reason) == (4, None, "forecasts for 1 of 4 pods: holding")
    d = rec.decide(30, 0.2, current=4, missing=2, covered=2)  # 2 of 4: decided, missing at target
    assert (d.replicas, d.missing) == (3, 2)  # ceil((0.2 + 2 * 0.5) / 0.5) = 3


# config -------------------------------------------------------------------------------------------
def test_config_reads_workloads_from_yaml_env_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "scaler.yaml"
    path.write_text(yaml.safe_dump({"scaler": {
        "prometheus": {"url": "http://prom:9090"}, "target": 0.7, "max_replicas": 12,
        "scale_down_tolerance": 0.2, "scale_up": {"policies": [{"type": "pods", "value": 16, "period_seconds": 60}]},
        "workloads": [{"namespace": "serving", "name": "llm", "max_replicas": 6, "scale_up": {"tolerance": 0},
                       "scale_down": {"stabilization_seconds": 600,
                                      "policies": [{"type": "pods", "value": 1, "period_seconds": 60}]}},
                      {"namespace": "batch", "name": "db", "kind": "StatefulSet", "pods": "db-[0-9]+"}]}}))
    config = load_config({"config": str(path), "interval": "10"}, env={"DPROBE_SCALER_TARGET": "0.6"})
    assert (config.prometheus_url, config.interval, config.target) == ("http://prom:9090", 10.0, 0.6)
    llm, db = config.workload_specs()
    assert (llm.policy.target, llm.policy.max_replicas, llm.policy.scale_down.stabilization_seconds) == (0.6, 6, 600)
    assert llm.policy.scale_down.policies == (RatePolicy("pods", 1, 60),)
    assert (llm.policy.scale_up.tolerance, llm.policy.scale_down.tolerance, db.policy.scale_up.tolerance,
            db.policy.scale_down.tolerance, db.policy.tolerance) == (0.0, 0.2, None, 0.2, 0.1)
    # top-level scale_up: {policies: ...} is scale_up_policies, the default of every workload and VC
    assert llm.policy.scale_up.policies == db.policy.scale_up.policies == config.gpu_policy().scale_up.policies \
        == (RatePolicy("pods", 16, 60),)
    assert config.default_policy().scale_down.policies == (RatePolicy("percent", 100, 15),)  # the HPA's
    assert llm.pods.fullmatch("llm-7d9f8c6b5d-x2k4p") and not llm.pods.fullmatch("llm-proxy-7d9f8c6b5d-x2k4p")
    assert (db.kind, db.policy.max_replicas, bool(db.pods.fullmatch("db-2"))) == ("StatefulSet", 12, True)
    env = {"DPROBE_SCALER_WORKLOADS": json.dumps([{"namespace": "a", "name": "b"}])}
    assert [s.key for s in load_config({}, env=env).workload_specs()] == [("a", "b")]


@pytest.mark.parametrize(("workload", "message"), [
    ({"namespace": "a"}, r"workloads\[0\]: name is required"),
    ({"namespace": "a", "name": "b", "replicas": 3}, r"unknown key\(s\) replicas"),
    ({"namespace": "a", "name": "b", "kind": "Job"}, "kind must be one of"),
    ({"namespace": "a", "name": "b", "pods": "b-("}, r"workloads\[0\] \(a/b\)"),
    ({"namespace": "a", "name": "b", "min_replicas": 9, "max_replicas": 2}, "min_replicas"),
    ({"namespace": "a", "name": "b", "scale_up": {"policies": [{"type": "pods"}]}}, "value"),
    ({"namespace": "a", "name": "b", "scale_down": {"tolerance": -1}}, r"\(a/b\): tolerance must be >= 0"),
    ({"namespace": "a", "name": "b", "activation_query": "up"}, r"\(a/b\): activation_query .* needs min_replicas: 0"),
    ({"namespace": "a", "name": "b", "min_replicas": 0, "activation_query_threshold": 2}, "needs an activation_query"),
    ({"namespace": "a", "name": "b", "min_replicas": 0, "activation_query": "up", "activation_query_threshold": "x"},
     "activation_query_threshold must be a number"),
])
def test_bad_workload_entries_are_refused_with_their_place(workload: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScalerConfig(workloads=[workload]).validate()


def test_config_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="prometheus_url"):
        ScalerConfig(prometheus_url="prom:9090").validate()
    with pytest.raises(ValueError, match="quantile"):
        ScalerConfig(quantile=90).validate()
    with pytest.raises(ValueError, match="DPROBE_SCALER_INTERVAL"):
        load_config({}, env={"DPROBE_SCALER_INTERVAL": "soon"})
    with pytest.raises(ValueError, match="scale_down_policies: unknown rate policy key"):
        load_config({}, env={"DPROBE_SCALER_SCALE_DOWN_POLICIES": '[{"type": "pods", "value": 1, "period": 60}]'})
    with pytest.raises(ValueError, match="scale_up_policies: rate policy type must be pods or percent"):
        ScalerConfig(scale_up_policies=[{"type": "gpus", "value": 2}]).validate()
    with pytest.raises(ValueError, match="scale_up_tolerance must be >= 0"):
        load_config({}, env={"DPROBE_SCALER_SCALE_UP_TOLERANCE": "-0.1"})


# demand -------------------------------------------------------------------------------------------
def _forecast(ns: str, pod: str, value: float, **labels: str) -> tuple[tuple[str, str], tuple[float, dict]]:
    return (ns, pod), (value, {"target": f"{ns}/{pod}", "namespace": ns, "pod": pod, **labels})


def test_demand_sums_pods_per_workload_discovered_deployment_and_virtual_cluster() -> None:
    spec = WorkloadSpec.parse({"namespace": "serving", "name": "llm"}, Policy())
    forecasts = dict([
        _forecast("serving", "llm-7d9f8c6b5d-aaaaa", 0.9), _forecast("serving", "llm-7d9f8c6b5d-bbbbb", 0.7),
        _forecast("serving", "embed-5c8d7f9b6-ccccc", 0.4), _forecast("team-a", "train-0", 0.5),
        _forecast("serving", "standalone", 0.2),
    ])
    gpus = {("team-a", "train-0"): (4, {"namespace": "team-a", "pod": "train-0"}),
            # holding GPUs, without a forecast: missing, never 0
            ("serving", "llm-7d9f8c6b5d-ccccc"): (1, {"namespace": "serving", "pod": "llm-7d9f8c6b5d-ccccc"}),
            ("team-b", "train-1"): (2, {"namespace": "team-b", "pod": "train-1"})}
    view = group_demand(forecasts, [spec], gpus, vc_label="namespace", discover=True)
    llm = view.workloads[("serving", "llm")]
    assert (round(llm.total, 6), len(llm.pods), llm.missing) == (1.6, 2, ["llm-7d9f8c6b5d-ccccc"])
    assert list(view.discovered) == [("serving", "embed")]  # train-0 and standalone are not Deployment pods
    assert round(view.vcs["team-a"].total, 6) == 2.0 and view.vcs["team-a"].gpus == 4  # 0.5 x 4 GPUs
    assert round(view.vcs["serving"].total, 6) == 2.2 and view.vcs["serving"].gpus == 5
    assert view.vcs["serving"].missing_gpus == 1
    team_b = view.vcs["team-b"]
    assert (team_b.total, team_b.pods, team_b.gpus, team_b.missing_gpus) == (0.0, [], 2, 2)
    quiet = group_demand(forecasts, [spec], {}, vc_label="", discover=False)
    assert (quiet.discovered, quiet.vcs) == ({}, {})


def test_forecast_query_selects_horizon_quantile_and_extra_matchers() -> None:
    q = forecast_query(ScalerConfig(horizon_seconds=900, quantile=0.99, forecast_selector='job="dprobe"',
                                    job_profiles=False))
    assert q == 'dprobe_predicted_gpu_utilization_ratio{horizon_seconds="900",quantile="0.99",pod!="",job="dprobe"}'
    # pods without a forecast yet: their training job's cold-start utilisation (p90, the profiles' highest)
    assert forecast_query(ScalerConfig(horizon_seconds=900, quantile=0.99, forecast_selector='job="dprobe"')) == (
        q + ' or on (namespace, pod) dprobe_job_predicted_gpu_utilization_ratio{quantile="0.9",pod!="",job="dprobe"}')
    assert forecast_query(ScalerConfig(quantile=0.5)).endswith('ratio{quantile="0.5",pod!=""}')


# the service against stand-ins ----------------------------------------------------------------------
def _vector(rows: list[tuple[dict, float]]) -> str:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [0, str(v)]} for m, v in rows]}})


def _prometheus_reply(pods: dict[str, float], up: list[bool]):
    """A Prometheus API answering the forecast query with ``pods`` (pod -> p90), kube-state-metrics' replicas with
    the pods of each Deployment (``NAME-<hash>-<id>``) or StatefulSet (``NAME-<n>``), and GPU counts of 1."""
    def reply(path: str) -> tuple[int, str, float]:
        if not up[0]:
            return 503, "down", 0.0
        if "dprobe_predicted" in path:
            return 200, _vector([({"target": f"serving/{p}", "namespace": "serving", "pod": p}, v)
                                 for p, v in pods.items()]), 0.0
        if "kube_deployment_spec_replicas" in path:
            owners = Counter(p.rsplit("-", 1 if p.rsplit("-", 1)[1].isdigit() else 2)[0] for p in pods)
            return 200, _vector([({"namespace": "serving", "workload": w}, n) for w, n in owners.items()]), 0.0
        return 200, _vector([({"namespace": "serving", "pod": p}, 1) for p in pods]), 0.0
    return reply


def test_scaler_recommends_follows_its_recommendation_and_falls_back(http_peer) -> None:
    pods = {"llm-7d9f8c6b5d-aaaaa": 0.9, "llm-7d9f8c6b5d-bbbbb": 0.9}
    up = [True]
    clock = iter(range(0, 10**6, 30))
    with http_peer(_prometheus_reply(pods, up)) as url:
        config = ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, fallback_replicas=2, failure_threshold=2,
                              workloads=[{"namespace": "serving", "name": "llm", "max_replicas": 8}])
        scaler = Scaler(config, clock=lambda: float(next(clock)))
        scaler.cycle()
        d = scaler.decisions[("serving", "llm")]
        assert (d.current, d.replicas, round(d.demand, 6)) == (2, 4, 1.8)  # two pods seen; ceil(1.8 / 0.5)
        assert scaler.vc_decisions["serving"].replicas == 4  # 1.8 GPUs busy, 0.5 each: ceil(3.6)
        scaler.cycle()  # recommend mode: starts from its recommendation, as if followed
        assert (scaler.decisions[("serving", "llm")].current, scaler.decisions[("serving", "llm")].replicas) == (4, 4)
        assert scaler.ready()[0]
        up[0] = False
        scaler.cycle()
        ready, why = scaler.ready()
        assert not ready and "HTTP 503" in why and "dprobe_predicted_gpu_utilization_ratio{" in why  # as written
        scaler.cycle()
        d = scaler.decisions[("serving", "llm")]
        # KEDA's fallback with currentReplicasIfHigher: max(4, fallback_replicas 2), never a drop to 2
        assert (d.replicas, d.reason) == (4, "fallback")
        assert scaler.errors_total["query"] == 2 and scaler.vc_decisions  # clusters keep their last decision
        text = generate_latest(scaler.registry).decode()
    assert 'dprobe_recommended_replicas{namespace="serving",workload="llm"} 4.0' in text
    assert 'dprobe_scaler_errors_total{stage="query"} 2.0' in text
    assert 'dprobe_recommended_gpus{vc="serving"} 4.0' in text
    assert 'dprobe_scaler_scale_events_total{direction="up",namespace="serving",workload="llm"} 1.0' in text
    assert 'direction="down"' not in text


class _FakeApiServer(BaseHTTPRequestHandler):
    """The Kubernetes API's scale subresource of Deployments and StatefulSets, and ResourceQuotas, as the
    client calls them: ``server.replicas[(ns, "deployments", name)]``, ``server.quotas[(ns, name)]``."""

    SCALE = re.compile(r"/apis/apps/v1/namespaces/([^/]+)/(deployments|statefulsets)/([^/]+)/scale")
    QUOTA = re.compile(r"/api/v1/namespaces/([^/]+)/resourcequotas/([^/]+)")

    def _reply(self, code: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _object(self, patch: dict | None = None) -> dict | None:
        """The object at this path (after applying ``patch``, a merge of spec), or None."""
        path = self.path.split("?")[0]
        srv = self.server
        if m := self.SCALE.fullmatch(path):
            key = m.groups()
            if key not in srv.replicas:  # type: ignore[attr-defined]
                return None
            if patch:
                srv.replicas[key] = patch["spec"]["replicas"]  # type: ignore[attr-defined]
            n = srv.replicas[key]  # type: ignore[attr-defined]
            return {"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": {"name": key[2], "namespace": key[0]},
                    "spec": {"replicas": n}, "status": {"replicas": n}}
        if m := self.QUOTA.fullmatch(path):
            key = m.groups()
            if key not in srv.quotas:  # type: ignore[attr-defined]
                return None
            if patch:
                srv.quotas[key].update(patch["spec"]["hard"])  # type: ignore[attr-defined]
            return {"kind": "ResourceQuota", "apiVersion": "v1", "metadata": {"name": key[1], "namespace": key[0]},
                    "spec": {"hard": dict(srv.quotas[key])}}  # type: ignore[attr-defined]
        return None

    def _answer(self, doc: dict | None) -> None:
        if doc is None:
            doc = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                   "message": f"{self.path} not found"}
        self._reply(404 if doc.get("kind") == "Status" else 200, doc)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(self._object())

    def do_PATCH(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.patches.append((self.path, self.headers["Content-Type"], body))  # type: ignore[attr-defined]
        self._answer(self._object(body))

    def do_POST(self) -> None:  # noqa: N802 - only Events are created
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not re.fullmatch(r"/api/v1/namespaces/[^/]+/events", self.path.split("?")[0]):
            self._answer(None)
            return
        self.server.events.append(body)  # type: ignore[attr-defined]
        self._reply(201, {**body, "kind": "Event", "apiVersion": "v1",
                          "metadata": {**body["metadata"], "name": body["metadata"]["generateName"] + "x1"}})

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def fake_kubernetes(tmp_path: Path, replicas: dict, quotas: dict | None = None) -> Iterator[tuple[str, ThreadingHTTPServer]]:
    """A stand-in API server and a kubeconfig pointing at it (the real client talks to it)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FakeApiServer)
    srv.replicas, srv.quotas, srv.patches, srv.events = replicas, quotas or {}, [], []  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": f"http://127.0.0.1:{srv.server_address[1]}"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "users": [{"name": "test", "user": {"token": "t"}}]}))
    try:
        yield str(kubeconfig), srv
    finally:
        srv.shutdown()
        srv.server_close()


def test_discovered_workloads_and_clusters_are_forgotten_with_their_pods(http_peer) -> None:
    """Pods of an unlisted Deployment get recommendations (never applied); when they are gone, so is
    everything the scaler kept for them (the series stay bounded as workloads come and go). A virtual cluster
    whose pods all went silent is held for restore_seconds, then forgotten."""
    pods = {"embed-5c8d7f9b6-aaaaa": 0.9, "embed-5c8d7f9b6-bbbbb": 0.9}
    clock = iter(range(0, 10**6, 30))
    with http_peer(_prometheus_reply(pods, [True])) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, restore_seconds=60),
                        clock=lambda: float(next(clock)))
        scaler.cycle()
        assert scaler.decisions[("serving", "embed")].replicas == 4 and scaler.events_total
        pods.clear()
        pods["other-0"] = 0.5  # not a Deployment's pod; the namespace stays a virtual cluster
        scaler.cycle()
        assert ("serving", "embed") not in scaler.decisions and ("serving", "embed") not in scaler.workloads.recommenders
        assert not scaler.events_total and set(scaler.vc_decisions) == {"serving"}
        pods.clear()
        scaler.cycle()  # 30 s after its last decision on data: held
        assert scaler.vc_decisions["serving"].replicas == 4 and scaler.vc_decisions["serving"].demand is None
        scaler.cycle()  # 60 s
        scaler.cycle()  # 90 s: forgotten
        assert not scaler.vc_decisions and not scaler.vcs.recommenders and not scaler.vc_events_total


@pytest.mark.slow
def test_apply_mode_reads_and_patches_the_scale_subresource(http_peer, tmp_path: Path) -> None:
    pods = {"llm-7d9f8c6b5d-aaaaa": 0.9, "llm-7d9f8c6b5d-bbbbb": 0.9, "db-0": 0.1, "db-1": 0.1}
    replicas = {("serving", "deployments", "llm"): 2, ("serving", "statefulsets", "db"): 2}
    clock = iter(range(0, 10**6, 30))
    with http_peer(_prometheus_reply(pods, [True])) as url, fake_kubernetes(tmp_path, replicas) as (kubeconfig, api):
        config = ScalerConfig(prometheus_url=url, mode="apply", kubeconfig=kubeconfig, target=0.5, margin=0.0,
                              scale_down_stabilization_seconds=0, workloads=[
                                  {"namespace": "serving", "name": "llm"},
                                  {"namespace": "serving", "name": "db", "kind": "StatefulSet"},
                                  {"namespace": "serving", "name": "gone"}])
        scaler = Scaler(config, clock=lambda: float(next(clock)))
        scaler.cycle()
        assert replicas == {("serving", "deployments", "llm"): 4, ("serving", "statefulsets", "db"): 1}
        assert {p[0].split("?")[0] for p in api.patches} == {
            "/apis/apps/v1/namespaces/serving/deployments/llm/scale",
            "/apis/apps/v1/namespaces/serving/statefulsets/db/scale"}
        assert all(body == {"spec": {"replicas": replicas[k]}} for k, (_, _, body) in
                   zip(sorted(replicas), sorted(api.patches, key=lambda p: p[0]), strict=True))
        assert scaler.errors_total["kubernetes"] == 1  # "gone" does not exist: counted, the rest applied
        # an Event on each workload it rescaled, as the HPA records on itself (kubectl describe shows them)
        events = {(e["involvedObject"]["kind"], e["involvedObject"]["name"]): e for e in api.events}
        assert set(events) == {("Deployment", "llm"), ("StatefulSet", "db")} and not scaler.errors_total["events"]
        llm = events[("Deployment", "llm")]
        assert (llm["reason"], llm["type"], llm["source"]["component"], llm["involvedObject"]["apiVersion"]) == (
            "SuccessfulRescale", "Normal", "dprobe-scaler", "apps/v1")
        assert llm["message"] == ("New size: 4; reason: forecast; demand 1.80 pod-equivalents "
                                  "(p90 of GPU utilisation 300 s ahead)")
        replicas[("serving", "deployments", "llm")] = 3  # someone scaled it by hand: the scaler reads it
        scaler.cycle()
        assert scaler.decisions[("serving", "llm")].current == 3 and replicas[("serving", "deployments", "llm")] == 4
        # discovered workloads are recommended, never applied
        assert all("/gone/" not in p[0] for p in api.patches)


@pytest.mark.slow
def test_apply_mode_scales_from_zero_on_the_activation_query_and_leaves_paused_workloads(http_peer,
                                                                                        tmp_path: Path) -> None:
    """A workload with min_replicas 0 rests at zero (its missing forecasts are no failure, so no fallback),
    is woken when its activation query passes the threshold, scaled on its pods' forecasts from then on,
    and sent back to zero when both fall. One scaled to zero by hand with min_replicas 1 is left there."""
    pods: dict[str, float] = {}
    queue = ["0"]  # the activation query's answer
    asked: list[str] = []

    def reply(path: str) -> tuple[int, str, float]:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).get("query", [""])[0]
        asked.append(query)
        if query.startswith("sum(queue_length"):
            if queue[0] == "error":
                return 400, json.dumps({"status": "error", "error": "parse error"}), 0.0
            return 200, _vector([({}, float(queue[0]))] if queue[0] != "none" else []), 0.0
        return 200, _vector([({"target": f"batch/{p}", "namespace": "batch", "pod": p}, v if "dprobe" in query else 1)
                             for p, v in pods.items()]), 0.0

    replicas = {("batch", "deployments", "trainer"): 0, ("batch", "deployments", "paused"): 0}
    clock = iter(range(0, 10**6, 30))
    with http_peer(reply) as url, fake_kubernetes(tmp_path, replicas) as (kubeconfig, api):
        config = ScalerConfig(prometheus_url=url, mode="apply", kubeconfig=kubeconfig, target=0.5, margin=0.0,
                              fallback_replicas=3, failure_threshold=1, scale_down_stabilization_seconds=60,
                              workloads=[{"namespace": "batch", "name": "trainer", "min_replicas": 0,
                                          "activation_query": 'sum(queue_length{queue="batch"})',
                                          "activation_query_threshold": 2},
                                         {"namespace": "batch", "name": "paused"}])
        scaler = Scaler(config, clock=lambda: float(next(clock)))
        for _ in range(3):  # nothing queued, no pods: resting at zero, never the fallback
            scaler.cycle()
        assert replicas == {("batch", "deployments", "trainer"): 0, ("batch", "deployments", "paused"): 0}
        assert not api.patches and scaler.decisions[("batch", "paused")].reason == "paused: scaled to zero by hand"
        assert scaler.decisions[("batch", "trainer")].reason == "below activation"
        queue[0] = "2"  # at the threshold: not above it
        scaler.cycle()
        assert replicas[("batch", "deployments", "trainer")] == 0
        queue[0] = "5"
        scaler.cycle()
        d = scaler.decisions[("batch", "trainer")]
        assert (d.current, d.replicas, d.reason, replicas[("batch", "deployments", "trainer")]) == (0, 1, "activated", 1)
        assert api.events[-1]["message"].startswith("New size: 1; reason: activated")
        pods.update({"trainer-6b7c8d9f5-aaaaa": 0.9})  # its pod runs and is forecast busy
        scaler.cycle()
        assert replicas[("batch", "deployments", "trainer")] == 2  # ceil(0.9 / 0.5), on the forecast
        queue[0] = "error"  # a failing query: counted, the workload kept running
        pods["trainer-6b7c8d9f5-aaaaa"] = 0.0
        scaler.cycle()
        d = scaler.decisions[("batch", "trainer")]
        assert scaler.errors_total["query"] == 1 and (d.desired, d.replicas) == (1, 2)  # held off zero, stabilised
        queue[0] = "none"  # an empty answer is 0: inactive and idle, so back to zero once the window has passed
        trace = []
        for _ in range(5):
            scaler.cycle()
            trace.append(replicas[("batch", "deployments", "trainer")])
        # 60 s of stabilisation: the 2 and then the 1 leave the window; while the scale says 2 and one pod is
        # forecast, the other counts at target (the HPA's missing pod), so the first step down is to 1, not 0
        assert trace == [2, 1, 1, 1, 0]
        assert all("/paused/" not in p[0] for p in api.patches)
        text = generate_latest(scaler.registry).decode()
    assert 'dprobe_scaler_active{namespace="batch",workload="trainer"} 0.0' in text
    assert 'dprobe_scaler_activation_query_value{namespace="batch",workload="trainer"} 0.0' in text
    assert 'sum(queue_length{queue="batch"})' in asked


def test_apply_mode_sets_virtual_cluster_quotas(http_peer, tmp_path: Path) -> None:
    """With vc_quota_name, a virtual cluster's GPUs start from its ResourceQuota's limit and are written
    back to it; a namespace without that quota is an error that does not stop the others."""
    pods = {"llm-7d9f8c6b5d-aaaaa": 0.9, "llm-7d9f8c6b5d-bbbbb": 0.9}
    gpu = "requests.nvidia.com/gpu"
    quotas = {("serving", "gpu-quota"): {gpu: "10", "pods": "50"}}
    clock = iter(range(0, 10**6, 30))
    with http_peer(_prometheus_reply(pods, [True])) as url, fake_kubernetes(tmp_path, {}, quotas) as (kubeconfig, api):
        config = ScalerConfig(prometheus_url=url, mode="apply", kubeconfig=kubeconfig, target=0.5, margin=0.0,
                              scale_down_stabilization_seconds=0, vc_quota_name="gpu-quota")
        scaler = Scaler(config, clock=lambda: float(next(clock)))
        scaler.cycle()
        d = scaler.vc_decisions["serving"]
        assert (d.current, d.replicas) == (10, 4)  # from the quota's 10 GPUs to ceil(1.8 / 0.5)
        assert quotas[("serving", "gpu-quota")] == {gpu: "4", "pods": "50"}  # only the GPU limit changed
        assert api.patches[-1][2] == {"spec": {"hard": {gpu: "4"}}}
        [event] = api.events
        assert (event["involvedObject"]["kind"], event["involvedObject"]["name"], event["message"][:12]) == (
            "ResourceQuota", "gpu-quota", "New size: 4;")
        assert scaler.vc_events_total[("serving", "down")] == 1
        quotas[("serving", "gpu-quota")][gpu] = "3"  # lowered by hand: read back, raised again
        scaler.cycle()
        assert (scaler.vc_decisions["serving"].current, quotas[("serving", "gpu-quota")][gpu]) == (3, "4")
        del quotas[("serving", "gpu-quota")]
        scaler.cycle()
        assert scaler.errors_total["kubernetes"] == 1 and scaler.vc_decisions["serving"].replicas == 4
    with pytest.raises(ValueError, match="vc_label: namespace"):
        ScalerConfig(vc_quota_name="q", vc_label="team").validate()


PENDING_QUERY = ('sum by (namespace) (kube_pod_container_resource_requests{resource="nvidia_com_gpu"} '
                 '* on (namespace, pod) group_left() (kube_pod_status_phase{phase="Pending"} == 1))')


def test_waiting_gpus_count_in_a_virtual_clusters_demand(http_peer) -> None:
    """vc_pending_query adds the GPUs waiting in each virtual cluster (pods not scheduled, queued jobs, which
    no sidecar forecasts) to its demand, a cluster with nothing running too; a failing query is counted and
    the demand is the forecasts' alone."""
    pods = {"llm-7d9f8c6b5d-aaaaa": 0.9, "llm-7d9f8c6b5d-bbbbb": 0.9}
    forecasts, pending_up = _prometheus_reply(pods, [True]), [True]
    asked: list[str] = []

    def reply(path: str) -> tuple[int, str, float]:
        if 'phase="Pending"' not in urllib.parse.unquote_plus(path):
            return forecasts(path)
        asked.append(urllib.parse.unquote_plus(path))
        if not pending_up[0]:
            return 400, '{"status": "error", "error": "parse error"}', 0.0
        return 200, _vector([({"namespace": "serving"}, 2), ({"namespace": "serving"}, 1),
                             ({"namespace": "batch"}, 2), ({}, 7)]), 0.0

    clock = iter(range(0, 10**6, 30))
    with http_peer(reply) as url:
        config = ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, vc_pending_query=PENDING_QUERY)
        scaler = Scaler(config, clock=lambda: float(next(clock)))
        scaler.cycle()
        serving, batch = scaler.vc_decisions["serving"], scaler.vc_decisions["batch"]
        assert (round(serving.demand, 6), serving.desired) == (4.8, 10)  # 1.8 busy + 3 waiting, 0.5 each
        assert (serving.current, serving.replicas) == (2, 6)  # from the 2 GPUs held, by the HPA's rate limit
        assert (batch.demand, batch.replicas, scaler.vc_held_gpus["batch"]) == (2.0, 4, 0)  # only waiting GPUs
        text = generate_latest(scaler.registry).decode()
        assert 'dprobe_scaler_vc_pending_gpus{vc="serving"} 3.0' in text
        assert 'dprobe_scaler_vc_demand_gpus{vc="serving"} 4.8' in text
        pending_up[0] = False
        scaler.cycle()
        assert scaler.errors_total["query"] == 1 and round(scaler.vc_decisions["serving"].demand, 6) == 1.8
        assert PENDING_QUERY in asked[0]
        # the cluster of waiting GPUs only is absent from the answer: held, not dropped (missing data never lowers)
        assert (scaler.vc_decisions["batch"].replicas, scaler.vc_decisions["batch"].demand) == (4, None)
    with pytest.raises(ValueError, match="vc_pending_query needs vc_label"):
        ScalerConfig(vc_pending_query=PENDING_QUERY, vc_label="").validate()


def test_a_failed_rescale_is_an_event_and_a_failed_event_only_counted(http_peer) -> None:
    class Kube:
        def __init__(self) -> None:
            self.events: list[tuple] = []

        def replicas(self, spec: WorkloadSpec) -> int:
            return 2

        def scale(self, spec: WorkloadSpec, n: int) -> None:
            raise KubernetesError(f"Deployment {spec.namespace}/{spec.name}: patch scale: HTTP 409 Conflict")

        def record_event(self, obj, reason: str, message: str, warning: bool = False) -> None:
            self.events.append((obj.kind, obj.name, reason, message, warning))
            if len(self.events) > 1:
                raise KubernetesError("Deployment serving/llm: record event: HTTP 403 Forbidden")

    kube = Kube()
    pods = {"llm-7d9f8c6b5d-aaaaa": 0.9, "llm-7d9f8c6b5d-bbbbb": 0.9}
    clock = iter(range(0, 10**6, 30))
    with http_peer(_prometheus_reply(pods, [True])) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, mode="apply", target=0.5, margin=0.0,
                                     workloads=[{"namespace": "serving", "name": "llm"}]),
                        kube=kube, clock=lambda: float(next(clock)))  # type: ignore[arg-type]
        scaler.cycle()
        assert kube.events == [("Deployment", "llm", "FailedRescale",
                                "New size: 4; error: Deployment serving/llm: patch scale: HTTP 409 Conflict", True)]
        scaler.cycle()  # the event itself fails now: counted, the cycle goes on
        assert scaler.errors_total["events"] == 1 and scaler.errors_total["kubernetes"] == 2
        assert scaler.decisions[("serving", "llm")].replicas == 4
        quiet = Kube()
        Scaler(ScalerConfig(prometheus_url=url, mode="apply", events=False,
                            workloads=[{"namespace": "serving", "name": "llm"}]),
               kube=quiet, clock=lambda: float(next(clock))).cycle()  # type: ignore[arg-type]
        assert quiet.events == []


def test_kubernetes_errors_name_the_workload(tmp_path: Path) -> None:
    with fake_kubernetes(tmp_path, {}, {("ns", "cpu-only"): {"pods": "5"}}) as (kubeconfig, _):
        client = ScaleClient(kubeconfig, timeout=2)
        spec = WorkloadSpec.parse({"namespace": "ns", "name": "missing"}, Policy())
        with pytest.raises(KubernetesError, match=r"Deployment ns/missing: read scale: HTTP 404"):
            client.replicas(spec)
        with pytest.raises(KubernetesError, match=r"ResourceQuota ns/q: read: HTTP 404"):
            client.quota("ns", "q", "requests.nvidia.com/gpu")
        with pytest.raises(KubernetesError, match=r"ResourceQuota ns/cpu-only: no hard limit on requests.nvidia.com/gpu"):
            client.quota("ns", "cpu-only", "requests.nvidia.com/gpu")


@pytest.mark.slow
def test_cli_help_and_bad_config_exit_code(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "dprobe.cli", "scaler"]
    out = subprocess.run([*run, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for flag in ("--prometheus-url", "--mode", "--horizon-seconds", "--quantile", "DPROBE_SCALER_TARGET"):
        assert flag in out.stdout
    out = subprocess.run([*run, "--help-all"], capture_output=True, text=True, timeout=60)  # every option
    assert out.returncode == 0 and "--scale-down-stabilization-seconds" in out.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("workloads: [{namespace: a, name: b, kind: CronJob}]\n")
    r = subprocess.run([*run, "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "kind must be one of" in r.stderr and "Traceback" not in r.stderr


# missing or bad data never lowers a count -----------------------------------------------------------
def _cluster_reply(forecasts: dict[str, float], gpus: list[str], replicas: dict[str, int] | None = None,
                   previous: dict[str, int] | None = None, previous_gpus: dict[str, int] | None = None,
                   vc_gpus: dict[str, int] | None = None, previous_held: dict[str, tuple[int, float]] | None = None):
    """A Prometheus API for the scaler's queries in namespace ``serving``: ``forecasts`` (pod -> p90, any float,
    NaN and infinities included), the pods DCGM shows holding a GPU (``gpus``), kube-state-metrics' replicas
    per Deployment and GPUs per namespace (``vc_gpus``; by default those of ``gpus``), and what the scaler's last
    run left: its recommendations (workload -> replicas, vc -> GPUs) and the GPUs each virtual cluster's pods held
    at its last decision on data, with how long ago (vc -> (GPUs, seconds))."""
    def reply(path: str) -> tuple[int, str, float]:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).get("query", [""])[0]
        if "last_over_time(dprobe_recommended_replicas" in query:
            rows = [({"namespace": "serving", "workload": w}, n) for w, n in (previous or {}).items()]
        elif "last_over_time(dprobe_recommended_gpus" in query:
            rows = [({"vc": vc}, n) for vc, n in (previous_gpus or {}).items()]
        elif "last_over_time(dprobe_scaler_vc_last_data_gpus" in query:
            rows = [({"vc": vc}, n) for vc, (n, _) in (previous_held or {}).items()]
        elif "last_over_time(dprobe_scaler_vc_last_data_timestamp_seconds" in query:
            rows = [({"vc": vc}, age) for vc, (_, age) in (previous_held or {}).items()]
        elif "kube_pod_container_resource_requests" in query:
            rows = [({"namespace": vc}, n) for vc, n in ({"serving": len(gpus)} if vc_gpus is None
                                                         else vc_gpus).items()]
        elif "kube_deployment_spec_replicas" in query:
            rows = [({"namespace": "serving", "workload": w}, n) for w, n in (replicas or {}).items()]
        elif "dprobe_predicted" in query:
            rows = [({"target": f"serving/{p}", "namespace": "serving", "pod": p}, v) for p, v in forecasts.items()]
        else:  # the GPUs per pod (DCGM)
            rows = [({"namespace": "serving", "pod": p}, 1) for p in gpus]
        return 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": m, "value": [0, repr(float(v)).replace("inf", "Inf").replace("nan", "NaN")]}
            for m, v in rows]}}), 0.0
    return reply


PODS = [f"llm-7d9f8c6b5d-{c * 5}" for c in "abcdef"]


def test_partial_forecasts_hold_the_count_in_recommend_and_apply_mode(http_peer, tmp_path: Path) -> None:
    """1 of 4 pods with a forecast (the others hold GPUs, their sidecars are gone): no 6 -> 5 -> 4 -> 3, no
    VC 6 -> 2; the missing pods are exported."""
    forecasts = {p: 0.4 for p in PODS[:4]}
    clock = iter(range(0, 10**6, 30))
    with http_peer(_cluster_reply(forecasts, PODS[:4], replicas={"llm": 4})) as url:
        config = ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, scale_down_stabilization_seconds=0,
                              workloads=[{"namespace": "serving", "name": "llm"}])
        scaler = Scaler(config, clock=lambda: float(next(clock)))
        scaler.cycle()
        assert scaler.decisions[("serving", "llm")].replicas == 4  # ceil(1.6 / 0.5)
        for pod in PODS[1:4]:
            del forecasts[pod]
        trace = []
        for _ in range(4):
            scaler.cycle()
            d = scaler.decisions[("serving", "llm")]
            trace.append((d.replicas, d.missing, scaler.vc_decisions["serving"].replicas))
        assert trace == [(4, 3, 4)] * 4
        assert scaler.decisions[("serving", "llm")].reason == "fallback" or \
            scaler.decisions[("serving", "llm")].reason.startswith("forecasts for 1 of 4 pods")
        text = generate_latest(scaler.registry).decode()
        assert 'dprobe_scaler_missing_pods{namespace="serving",workload="llm"} 3.0' in text
        assert 'dprobe_scaler_vc_missing_gpus{vc="serving"} 3.0' in text
    replicas = {("serving", "deployments", "llm"): 6}
    forecasts = {p: 0.4 for p in PODS[:2]}  # 2 of the 6 pods forecast, low: the other 4 count at target
    with http_peer(_cluster_reply(forecasts, PODS)) as url, fake_kubernetes(tmp_path, replicas) as (kubeconfig, api):
        scaler = Scaler(ScalerConfig(prometheus_url=url, mode="apply", kubeconfig=kubeconfig, target=0.5, margin=0.0,
                                     scale_down_stabilization_seconds=0, min_forecast_coverage=0.3,
                                     workloads=[{"namespace": "serving", "name": "llm"}]),
                        clock=lambda: float(next(clock)))
        for _ in range(3):
            scaler.cycle()
        d = scaler.decisions[("serving", "llm")]
        assert replicas[("serving", "deployments", "llm")] == 6 and not api.patches  # ceil((0.8 + 4 * 0.5) / 0.5)
        assert (d.demand, d.missing) == (pytest.approx(0.8), 4)


def test_an_answer_without_forecasts_is_an_error_and_holds_until_a_fallback_that_never_lowers(http_peer) -> None:
    """The sidecars are gone: Prometheus answers, with nothing (or NaN only). Counted as no_data, /readyz says
    so, the count held and, after failure_threshold, max(current, fallback_replicas)."""
    forecasts = {p: 0.9 for p in PODS[:5]}
    clock = iter(range(0, 10**6, 30))
    with http_peer(_cluster_reply(forecasts, [], replicas={"llm": 5})) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, fallback_replicas=2,
                                     failure_threshold=2,
                                     workloads=[{"namespace": "serving", "name": "llm", "max_replicas": 20}]),
                        clock=lambda: float(next(clock)))
        scaler.cycle()
        assert scaler.decisions[("serving", "llm")].replicas == 9 and scaler.ready()[0]  # ceil(4.5 / 0.5)
        forecasts.clear()
        forecasts.update({p: math.nan for p in PODS[:5]})
        scaler.cycle()
        ready, why = scaler.ready()
        assert not ready and "no usable forecast" in why
        assert scaler.errors_total["no_data"] == 1 and scaler.rejected_total["nan"] == 5
        forecasts.clear()
        for _ in range(3):
            scaler.cycle()
        d = scaler.decisions[("serving", "llm")]
        assert (d.replicas, d.reason) == (9, "fallback") and scaler.errors_total["no_data"] == 4


def test_bad_forecasts_are_dropped_and_counted_never_clipped_and_never_fail_other_workloads(http_peer) -> None:
    forecasts = {PODS[0]: math.inf, PODS[1]: 0.9, PODS[2]: -0.5, PODS[3]: 0.9, "db-0": 55.0, "db-1": 0.3}
    clock = iter(range(0, 10**6, 30))
    with http_peer(_cluster_reply(forecasts, [*PODS[:4], "db-0", "db-1"], replicas={"llm": 4, "db": 2})) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, tolerance=0.0,
                                     min_forecast_coverage=0.0, workloads=[
                                         {"namespace": "serving", "name": "llm"},
                                         {"namespace": "serving", "name": "db", "kind": "StatefulSet"}]),
                        clock=lambda: float(next(clock)))
        scaler.cycle()
        llm, db = scaler.decisions[("serving", "llm")], scaler.decisions[("serving", "db")]
        # the infinite and the negative forecast are missing pods, not 0 (else: ceil(1.8 / 0.5) = 4 -> 4 anyway,
        # but 0.3 / 0.5 would take db from 2 to 1): counted at target on the way down, so held
        assert (llm.demand, llm.missing, llm.replicas) == (pytest.approx(1.8), 2, 4)
        assert (db.demand, db.missing, db.replicas) == (pytest.approx(0.3), 1, 2)  # 5,500 % is no forecast
        assert dict(scaler.rejected_total) == {"infinite": 1, "negative": 1, "above_one": 1}
        assert not scaler.errors_total["cycle"]
        text = generate_latest(scaler.registry).decode()
    assert 'dprobe_scaler_rejected_forecasts_total{reason="infinite"} 1.0' in text


def test_a_restarted_scaler_publishes_nothing_before_data_and_starts_from_its_last_recommendation(
        http_peer) -> None:
    """After a restart with no forecasts: no dprobe_recommended_replicas (not 0, below min_replicas 1); with
    partial data: from the last recommendation Prometheus kept (6), not from the pods seen (2)."""
    forecasts: dict[str, float] = {}
    clock = iter(range(0, 10**6, 30))
    reply = _cluster_reply(forecasts, [], replicas={}, previous={"llm": 6}, previous_gpus={"serving": 6})
    with http_peer(reply) as url:
        config = ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, replicas_query="",
                              workloads=[{"namespace": "serving", "name": "llm"}])
        scaler = Scaler(config, clock=lambda: float(next(clock)))
        scaler.cycle()
        text = generate_latest(scaler.registry).decode()
        assert "dprobe_recommended_replicas{" not in text and "dprobe_recommended_gpus{" not in text
        assert scaler.decisions[("serving", "llm")].current == 6  # held at the restored count, not published
        forecasts.update({PODS[0]: 0.2, PODS[1]: 0.2})  # 2 of the 6 pods forecast again, both low
        for _ in range(3):
            scaler.cycle()
        d = scaler.decisions[("serving", "llm")]
        assert d.current == 6 and d.replicas == 6 and d.reason.startswith("forecasts for 2 of 6 pods")
        assert "dprobe_recommended_replicas{" not in generate_latest(scaler.registry).decode()
        forecasts.update({PODS[2]: 0.2, PODS[3]: 0.2})  # 4 of 6: decided, the 2 missing at target
        scaler.cycle()
        d = scaler.decisions[("serving", "llm")]
        assert (d.desired, d.replicas) == (4, 6)  # ceil((0.8 + 1.0) / 0.5); down only after the window
        text = generate_latest(scaler.registry).decode()
    assert 'dprobe_recommended_replicas{namespace="serving",workload="llm"} 6.0' in text
    assert scaler.vc_decisions["serving"].current == 6


ELEVEN = [f"llm-7d9f8c6b5d-{c * 5}" for c in "abcdefghijk"]  # the 11 replicas of serving/llm, a GPU each


def _published(scaler: Scaler) -> dict[str, float]:
    """The recommendations on the scaler's /metrics page: ``{"llm": replicas, "serving": GPUs}``."""
    text = generate_latest(scaler.registry).decode()
    return {m[1] or m[2]: float(m[3]) for m in re.finditer(
        r'^dprobe_recommended_(?:replicas\{namespace="serving",workload="(\w+)"|gpus\{vc="([\w-]+)")\} (\S+)$', text,
        re.M)}


def test_a_workloads_count_never_read_is_not_known_and_nothing_is_published(http_peer) -> None:
    """serving/llm runs 11 replicas. Prometheus restarted on an empty TSDB (no earlier recommendation) and
    kube-state-metrics is not scraped yet: its first cycle sees no pod, the next 4 of the 11, idle, then all 11.
    The count was never read, so nothing is published (not 1, then 1 -> 5 -> 11); once kube-state-metrics shows
    11, the decisions start from 11 and the scale-down waits a full window from then."""
    forecasts: dict[str, float] = {}
    gpus: list[str] = []
    replicas: dict[str, int] = {}
    clock = iter(range(0, 10**6, 30))
    with http_peer(_cluster_reply(forecasts, gpus, replicas=replicas, vc_gpus={})) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, target=0.5, margin=0.0,
                                     scale_up_policies=[{"type": "percent", "value": 1000}],
                                     workloads=[{"namespace": "serving", "name": "llm", "max_replicas": 20}]),
                        clock=lambda: float(next(clock)))
        scaler.cycle()  # t = 0: nothing scraped yet
        for seen in (4, 11, 11):  # t = 30, 60, 90: the sidecars scraped, part then all, the replicas idle
            forecasts.update({p: 0.1 for p in ELEVEN[:seen]})
            gpus[:] = ELEVEN[:seen]
            scaler.cycle()
            d = scaler.decisions[("serving", "llm")]
            assert not d.published and d.reason.startswith("count not known yet"), d
            assert "llm" not in _published(scaler)
        replicas["llm"] = 11  # kube-state-metrics scraped: the count is read (t = 120)
        trace = []
        for _ in range(12):  # t = 120 ... 450
            scaler.cycle()
            d = scaler.decisions[("serving", "llm")]
            trace.append((d.current, d.replicas, _published(scaler)["llm"]))
    # ceil(1.1 / 0.5) = 3, after a full window from the first decision on a count read (t = 120): at t = 420
    assert trace == [(11, 11, 11.0)] * 10 + [(11, 3, 3.0), (3, 3, 3.0)], trace


def test_a_virtual_clusters_count_is_read_from_kube_state_metrics_never_from_the_gpus_seen(
        http_peer) -> None:
    """serving's pods hold 11 GPUs, as kube-state-metrics shows. After a restart without history the first cycle
    sees 4 of them (dcgm-exporter in part scraped) and no forecast, the next the 4 forecast, idle, then all 11:
    the cluster starts from the 11 read (never published 4; 4 of 11 GPUs with a forecast hold the count) and
    scales down a full window after its first decision. Without kube-state-metrics' answer its count is never
    read, and nothing is published for it: not the GPUs its pods are seen to hold."""
    forecasts: dict[str, float] = {}
    gpus = ELEVEN[:4]
    for ksm, expected in (({"serving": 11}, [None] + [11] * 8 + [3] * 4), ({}, [None] * 13)):
        forecasts.clear()
        gpus[:] = ELEVEN[:4]
        with http_peer(_cluster_reply(forecasts, gpus, replicas={}, vc_gpus=ksm)) as url:
            scaler = Scaler(ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, replicas_query="",
                                         scale_up_policies=[{"type": "percent", "value": 1000}]),
                            clock=iter(range(0, 10**6, 30)).__next__)
            scaler.cycle()  # t = 0: 4 GPUs seen, no forecast: held, nothing published
            assert "serving" not in _published(scaler)
            forecasts.update({p: 0.1 for p in ELEVEN[:4]})
            trace = []
            for _ in range(13):  # t = 30 ... 390
                scaler.cycle()
                trace.append(_published(scaler).get("serving"))
                forecasts.update({p: 0.1 for p in ELEVEN})
                gpus[:] = ELEVEN
        # kube-state-metrics: from its 11 at t = 0 to ceil(1.1 / 0.5) = 3 at t = 300; without it, not known
        assert trace == expected, (ksm, trace)


@pytest.mark.slow
def test_recommend_mode_reads_the_scale_where_kubernetes_lets_it(http_peer, tmp_path: Path) -> None:
    """Recommend mode with a kubeconfig, no kube-state-metrics, no earlier recommendation: a listed workload's
    count is its scale subresource, read (never patched); one whose scale cannot be read (absent, forbidden) is not
    known, asked no more, and nothing is published for it."""
    forecasts = {p: 0.1 for p in ELEVEN[:6]}
    replicas = {("serving", "deployments", "llm"): 11}
    clock = iter(range(0, 10**6, 30))
    with http_peer(_cluster_reply(forecasts, ELEVEN[:6], replicas={})) as url, \
            fake_kubernetes(tmp_path, replicas) as (kubeconfig, api):
        scaler = Scaler(ScalerConfig(prometheus_url=url, kubeconfig=kubeconfig, target=0.5, margin=0.0, workloads=[
            {"namespace": "serving", "name": "llm", "max_replicas": 20}, {"namespace": "serving", "name": "gone"}]),
            clock=lambda: float(next(clock)))
        for _ in range(3):
            scaler.cycle()
        llm, gone = scaler.decisions[("serving", "llm")], scaler.decisions[("serving", "gone")]
        # from the 11 read, 5 of them without a forecast (at target on the way down): held
        assert (llm.current, llm.replicas, llm.missing, llm.published) == (11, 11, 5, True)
        assert not gone.published and "gone" not in _published(scaler) and not api.patches
        assert scaler.actuator.unreadable == {("serving", "gone")} and not scaler.errors_total["kubernetes"]


def test_a_restarted_scaler_reads_back_the_gpus_a_silent_virtual_cluster_held(http_peer) -> None:
    """serving's 8 pods (a GPU each) went silent; the scaler restarts. Prometheus kept its 8 GPUs recommended, and
    the 8 GPUs its pods held at its last decision on data, 120 s before (on Prometheus's clock). 3 pods come back,
    busy (2.4 GPUs: 5 asked for): 3 of 8 GPUs with a forecast hold the cluster at 8, 5 missing, for good (not
    8 -> 5 once the window has passed, not "0 missing"), and the restarted scaler exports when they were held
    as it was (no new restore_seconds). Held longer ago than restore_seconds: not read back."""
    forecasts = {p: 0.8 for p in ELEVEN[:3]}
    mono, wall = [0.0], [1.7e9]
    for restore, expected in ((3600, (8, 5)), (100, (8, 0))):
        with http_peer(_cluster_reply(forecasts, ELEVEN[:3], replicas={}, vc_gpus={}, previous_gpus={"serving": 8},
                                      previous_held={"serving": (8, 120.0)})) as url:
            scaler = Scaler(ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, discover=False,
                                         restore_seconds=restore), clock=lambda: mono[0], wall_clock=lambda: wall[0])
            trace = []
            for t in range(0, 600, 30):
                mono[0], wall[0] = t, 1.7e9 + t
                scaler.cycle()
                d = scaler.vc_decisions["serving"]
                trace.append((d.replicas, d.missing))
            text = generate_latest(scaler.registry).decode()
        if restore == 3600:
            assert trace == [expected] * 20
            assert 'dprobe_scaler_vc_last_data_gpus{vc="serving"} 8.0' in text
            [at] = [s.value for f in text_string_to_metric_families(text) for s in f.samples
                    if s.name == "dprobe_scaler_vc_last_data_timestamp_seconds"]
            assert at == 1.7e9 - 120
        else:
            assert trace[0] == expected and trace[-1] == (5, 0)  # ceil(2.4 / 0.5), a window later


@pytest.mark.parametrize("step", [3600, -3600])
def test_windows_run_on_a_monotonic_clock_whatever_the_wall_clock_does(http_peer, step: int) -> None:
    """The scaler on two clocks: its windows, cooldowns and rate limits on the monotonic one, the wall clock only
    for what it exports. serving/llm at 8 replicas; the wall clock steps by an hour. Forward, just after demand
    fell: no 8 -> 2 six seconds later, the scale-down a full window after the last 8 asked for, as without the
    step. Backward, before demand rises: 8 -> 15 at once, not held by entries that seem to come from the
    future. The last cycle's timestamp is the wall clock's, stepped."""
    forecasts = {p: 0.5 for p in ELEVEN[:8]}
    mono, wall = [0.0], [1.7e9]
    with http_peer(_cluster_reply(forecasts, ELEVEN[:8], replicas={"llm": 8})) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, target=0.5, margin=0.0,
                                     workloads=[{"namespace": "serving", "name": "llm", "max_replicas": 20}]),
                        clock=lambda: mono[0], wall_clock=lambda: wall[0])

        def cycle(t: float, stepped: float = 0.0) -> int:
            mono[0], wall[0] = t, 1.7e9 + t + stepped
            scaler.cycle()
            return scaler.decisions[("serving", "llm")].replicas

        assert [cycle(0), cycle(30)] == [8, 8]  # 8 pods at 0.5, 0.5 each
        if step > 0:
            forecasts.update({p: 0.1 for p in ELEVEN[:8]})  # demand falls: ceil(0.8 / 0.5) = 2
            assert cycle(60) == 8  # stabilised: 8 was asked for at t = 30
            trace = {t: cycle(t, step) for t in range(66, 400, 30)}  # the wall clock an hour ahead from t = 63
            assert trace[66] == 8 and trace[306] == 8 and trace[336] == 2, trace  # 336 - 30 > 300
        else:
            wall[0] -= 3600  # t = 45: the wall clock an hour back
            forecasts.update({p: 0.9 for p in ELEVEN[:8]})  # demand rises: ceil(7.2 / 0.5) = 15
            assert cycle(60, step) == 15  # at most double per 15 s: 16 allowed
        text = generate_latest(scaler.registry).decode()
    [stamp] = [s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "dprobe_scaler_last_cycle_timestamp_seconds"]
    assert stamp == wall[0]


@contextmanager
def _untrusted_tls(tmp_path: Path, reply) -> Iterator[str]:
    """An HTTPS server answering ``reply`` with a self-signed certificate the scaler does not trust."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", "key.pem", "-out", "cert.pem", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], cwd=tmp_path, check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            code, body, _ = reply(self.path)
            self.send_response(code)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.socket = context.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("failure", ["down", "credentials refused", "untrusted certificate"])
def test_a_scaler_started_without_prometheus_publishes_nothing_and_never_falls_back_from_zero(
        http_peer, tmp_path: Path, failure: str) -> None:
    """KEDA follows 11 replicas, the last run's recommendation. The scaler restarts while Prometheus is down,
    refuses its credentials or shows a certificate it does not trust: the count is not known, so nothing is
    published (KEDA holds 11) and the fallback (2) never applies to it; once Prometheus answers, the decision
    starts from the 11 it kept, and the fallback is max(11, 2)."""
    up = [False]
    answer = _cluster_reply({}, [], replicas={}, previous={"llm": 11}, previous_gpus={"serving": 11})

    def reply(path: str) -> tuple[int, str, float]:
        if up[0]:
            return answer(path)
        return (401, "Unauthorized", 0.0) if failure == "credentials refused" else (503, "down", 0.0)

    clock = iter(range(0, 10**6, 30))
    with (_untrusted_tls(tmp_path, reply) if failure == "untrusted certificate" else http_peer(reply)) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, fallback_replicas=2,
                                     failure_threshold=2, replicas_query="",
                                     workloads=[{"namespace": "serving", "name": "llm", "max_replicas": 20}]),
                        clock=lambda: float(next(clock)))
        for _ in range(5):  # far past failure_threshold
            scaler.cycle()
        text = generate_latest(scaler.registry).decode()
        assert "dprobe_recommended_replicas{" not in text and "dprobe_recommended_gpus{" not in text, text
        d = scaler.decisions[("serving", "llm")]
        assert not d.published and d.reason.startswith("count not known yet")
        ready, why = scaler.ready()
        assert not ready and "cannot read the forecasts" in why and scaler.errors_total["query"] == 5
        if failure == "untrusted certificate":
            assert "certificate" in why
            return
        up[0] = True  # Prometheus answers (no forecast yet: the sidecars are not scraped)
        scaler.cycle()
        d = scaler.decisions[("serving", "llm")]
        assert (d.current, d.replicas, d.published) == (11, 11, False)  # held at the count it kept
        scaler.cycle()
        d = scaler.decisions[("serving", "llm")]
        assert (d.replicas, d.reason) == (11, "fallback")  # max(11, 2): KEDA keeps 11
        text = generate_latest(scaler.registry).decode()
    assert 'dprobe_recommended_replicas{namespace="serving",workload="llm"} 11.0' in text


def test_the_last_runs_recommendations_are_asked_for_until_prometheus_answers(http_peer) -> None:
    """The restore query failing (the forecasts answering): the counts are not known, nothing is published
    and the query is asked again each cycle; once it answers, decisions start from the last run's."""
    forecasts = {p: 0.2 for p in PODS[:4]}
    answer = _cluster_reply(forecasts, PODS[:4], replicas={}, previous={"llm": 6}, previous_gpus={"serving": 6},
                            vc_gpus={})
    refuse = [True]

    def reply(path: str) -> tuple[int, str, float]:
        if refuse[0] and "last_over_time" in path:
            return 500, "internal error", 0.0
        return answer(path)

    clock = iter(range(0, 10**6, 30))
    with http_peer(reply) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, replicas_query="",
                                     workloads=[{"namespace": "serving", "name": "llm"}]),
                        clock=lambda: float(next(clock)))
        scaler.cycle()
        scaler.cycle()
        text = generate_latest(scaler.registry).decode()
        assert "dprobe_recommended_replicas{" not in text and "dprobe_recommended_gpus{" not in text
        assert scaler.errors_total["query"] == 2 and not scaler.decisions[("serving", "llm")].published
        ready, why = scaler.ready()
        assert not ready and "the last run's recommendations cannot be read yet" in why
        refuse[0] = False
        scaler.cycle()
        d = scaler.decisions[("serving", "llm")]
        # from the 6 it kept, not the 4 pods seen: the 2 pods not seen are missing, at target on the way down
        assert (d.current, d.missing, d.desired, d.replicas) == (6, 2, 4, 6) and scaler.ready()[0]
        assert scaler.vc_decisions["serving"].current == 6
        assert 'dprobe_recommended_replicas{namespace="serving",workload="llm"} 6.0' in \
            generate_latest(scaler.registry).decode()


WEB = [f"web-6d5c4b3a2-{c * 5}" for c in "abcdefghijklmnopqr"]  # 18 replicas of a Deployment nobody listed


def test_discovered_workloads_expect_their_pods_as_listed_ones_do(http_peer) -> None:
    """"web" is discovered (not listed), 18 replicas as kube-state-metrics shows. 14 sidecars stop: forecasts for
    4 of 18 pods (22 %, below min_forecast_coverage) hold the count at 18, the 14 are exported as missing (never
    18 -> 8); all silent while kube-state-metrics still shows it: held; the Deployment gone: forgotten."""
    forecasts = {p: 0.45 for p in WEB}
    replicas = {"web": 18}
    clock = iter(range(0, 10**6, 30))
    with http_peer(_cluster_reply(forecasts, [], replicas=replicas)) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, scale_down_stabilization_seconds=0),
                        clock=lambda: float(next(clock)))
        scaler.cycle()
        d = scaler.decisions[("serving", "web")]
        assert (d.current, d.replicas, d.missing) == (18, 18, 0)  # 8.1 / (18 x 0.5) within tolerance
        for pod in WEB[4:]:
            del forecasts[pod]
        for _ in range(5):
            scaler.cycle()
            d = scaler.decisions[("serving", "web")]
            assert (d.replicas, d.missing) == (18, 14) and d.reason.startswith("forecasts for 4 of 18 pods")
        text = generate_latest(scaler.registry).decode()
        assert 'dprobe_recommended_replicas{namespace="serving",workload="web"} 18.0' in text
        assert 'dprobe_scaler_missing_pods{namespace="serving",workload="web"} 14.0' in text
        forecasts.update({p: 0.1 for p in WEB[:14]})  # 14 of 18 back, low: the 4 missing count at target
        scaler.cycle()
        d = scaler.decisions[("serving", "web")]
        assert (d.missing, d.desired) == (4, 7)  # ceil((1.4 + 4 x 0.5) / 0.5), not ceil(1.4 / 0.5) = 3
        assert d.replicas == 7
        forecasts.clear()
        scaler.cycle()  # every sidecar silent, the Deployment still there: held
        d = scaler.decisions[("serving", "web")]
        assert (d.replicas, d.demand, d.missing) == (7, None, 18)
        replicas.clear()  # the Deployment is gone
        scaler.cycle()
        assert ("serving", "web") not in scaler.decisions and ("serving", "web") not in scaler.workloads.recommenders


def test_a_virtual_clusters_gpus_are_held_when_its_sidecars_stop(http_peer) -> None:
    """8 pods of serving on a GPU each, half busy: 8 GPUs. Their sidecars stop and the GPU series go with them:
    dprobe_recommended_gpus{vc="serving"} stays at 8 (never gone, never restarted from the GPUs seen), its 8
    GPUs missing; 3 of the 8 back, busy: still 8 (3 of 8 GPUs with a forecast, below min_forecast_coverage),
    not 3 -> 5; 6 of 8 back: decided on, the 2 missing counted at target."""
    pods = [f"train-{i}" for i in range(8)]
    forecasts = {p: 0.5 for p in pods}
    gpus = list(pods)
    clock = iter(range(0, 10**6, 30))
    with http_peer(_cluster_reply(forecasts, gpus)) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, scale_down_stabilization_seconds=0,
                                     replicas_query=""), clock=lambda: float(next(clock)))
        scaler.cycle()
        assert scaler.vc_decisions["serving"].replicas == 8
        forecasts.clear()
        gpus.clear()
        for _ in range(3):
            scaler.cycle()
            d = scaler.vc_decisions["serving"]
            assert (d.replicas, d.demand, d.missing) == (8, None, 8)
        text = generate_latest(scaler.registry).decode()
        assert 'dprobe_recommended_gpus{vc="serving"} 8.0' in text
        assert 'dprobe_scaler_vc_missing_gpus{vc="serving"} 8.0' in text
        forecasts.update({p: 0.8 for p in pods[:3]})
        gpus.extend(pods[:3])
        for _ in range(3):
            scaler.cycle()
            d = scaler.vc_decisions["serving"]
            assert (d.current, d.replicas, d.missing) == (8, 8, 5) and d.reason.startswith("forecasts for 3 of 8")
        forecasts.update({p: 0.1 for p in pods[:6]})
        gpus[:] = pods[:6]
        scaler.cycle()
        d = scaler.vc_decisions["serving"]
        assert (d.missing, d.desired) == (2, 4)  # ceil((0.6 + 2 x 0.5) / 0.5)


@pytest.mark.slow
def test_scaler_config_refuses_what_could_only_fail_later(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"quantile must be one the sidecars export \(0.5, 0.9, 0.99\), got 0.42"):
        ScalerConfig(quantile=0.42).validate()
    with pytest.raises(ValueError, match=r"workloads\[1\]: serving/llm is listed twice \(also workloads\[0\]\)"):
        ScalerConfig(workloads=[{"namespace": "serving", "name": "llm"},
                                {"namespace": "serving", "name": "llm", "kind": "StatefulSet"}]).validate()
    with pytest.raises(ValueError, match="min_forecast_coverage must be between 0 and 1"):
        ScalerConfig(min_forecast_coverage=1.5).validate()
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [oops\n")
    r = subprocess.run([sys.executable, "-m", "dprobe.cli", "scaler", "--mode", "apply", "--kubeconfig", str(bad),
                        "--port", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "kubeconfig" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "dprobe.cli", "scaler", "--mode", "apply", "--kubeconfig",
                        str(tmp_path / "absent"), "--port", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "absent" in r.stderr and "Traceback" not in r.stderr
