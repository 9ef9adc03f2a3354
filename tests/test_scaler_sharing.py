"""GPU shares of the scaler: memory limits, fractions and MIG profiles per workload, the packing plan per virtual
cluster, bad input (no forecast, too large, unknown profile), config checks and the exported metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dprobe.services.scaler.config import ScalerConfig, load_config
from dprobe.services.scaler.service import Scaler
from dprobe.services.scaler.sharing import PodNeed, ShareRecommender
from dprobe.services.scaler.sharing_config import SharingSettings

GB = 1e9


def settings(**kw) -> SharingSettings:
    base = {"sharing_enabled": True, "sharing_gpu_model": "H100-80GB", "sharing_memory_margin": 0.15,
            "sharing_utilization_target": 0.9, "sharing_stabilization_seconds": 300.0}
    return ScalerConfig(**{**base, **kw}).validate().sharing_settings()


def pod(name: str, memory: float | None, util: float | None = 0.1, workload: str | None = "llm", vc: str = "team",
        gpus: int = 1, total: float | None = None) -> PodNeed:
    return PodNeed("serving", name, ("serving", workload) if workload else None, vc, gpus,
                   None if memory is None else memory * GB, util, total)


def pods(*needs: PodNeed) -> dict[tuple[str, str], PodNeed]:
    return {(p.namespace, p.pod): p for p in needs}


# per workload --------------------------------------------------------------------------------------
def test_memory_limit_is_the_largest_replica_forecast_plus_margin_and_fraction_the_larger_share() -> None:
    rec = ShareRecommender(settings())
    out = rec.recommend(0.0, pods(pod("a", 20, 0.1), pod("b", 30, 0.3), pod("c", 10, 0.05, workload="emb")))
    llm = out.workloads[("serving", "llm")]
    assert llm.memory_forecast == 30 * GB
    assert llm.memory_bytes == pytest.approx(34.5 * GB)  # 30 GB + 15 %
    assert llm.fraction == pytest.approx(0.44)  # 34.5 / 80 = 0.431 -> 0.44, above its utilisation 0.3
    assert llm.share_bytes == pytest.approx(34.5 * GB) and llm.reason == ""
    emb = out.workloads[("serving", "emb")]
    assert emb.fraction == pytest.approx(0.15)  # 11.5 / 80 = 0.144 -> 0.15
    busy = ShareRecommender(settings()).recommend(0.0, pods(pod("a", 8, 0.6)))
    assert busy.workloads[("serving", "llm")].fraction == pytest.approx(0.6)  # utilisation beyond memory share


def test_vc_needs_fewer_gpus_with_sharing_and_the_plan_respects_memory() -> None:
    rec = ShareRecommender(settings())
    needs = [pod(f"p{i}", 20, 0.2, workload=f"w{i}") for i in range(6)]  # 23 GB each with margin: 3 per GPU
    out = rec.recommend(0.0, pods(*needs))
    assert out.vc_gpus["team"] == (6, 2)
    per_gpu: dict[str, int] = {}
    for (_, gpu, _, _), n in out.colocation.items():
        per_gpu[gpu] = per_gpu.get(gpu, 0) + n
    assert sorted(per_gpu.values()) == [3, 3]
    assert out.placements[("team", "shared")] == 6 and not out.unplaced


def test_utilisation_target_is_kept_per_gpu() -> None:
    rec = ShareRecommender(settings(sharing_utilization_target=0.5))
    out = rec.recommend(0.0, pods(*[pod(f"p{i}", 5, 0.3, workload=f"w{i}") for i in range(4)]))
    assert out.vc_gpus["team"] == (4, 4)  # 0.3 + 0.3 > 0.5: no two share a GPU, though memory would allow it


def test_a_pod_without_memory_forecast_keeps_its_gpus_and_is_counted() -> None:
    rec = ShareRecommender(settings())
    out = rec.recommend(0.0, pods(pod("a", 10), pod("b", None), pod("c", None, workload="train", gpus=2),
                                  pod("d", 10, workload="emb")))
    assert out.vc_gpus["team"] == (5, 4)  # a and d share one GPU; b keeps 1, c keeps 2
    assert out.unplaced[("serving", "llm", "no_memory_forecast")] == 1
    assert out.unplaced[("serving", "train", "no_memory_forecast")] == 1
    assert out.placements[("team", "own_gpus")] == 2 and out.pod_reasons[("serving", "b")] == "no_memory_forecast"
    train = out.workloads[("serving", "train")]
    assert train.memory_bytes is None and train.reason == "no_memory_forecast"


def test_all_pods_without_forecast_never_pack_below_what_they_hold() -> None:
    out = ShareRecommender(settings()).recommend(0.0, pods(*[pod(f"p{i}", None, workload=f"w{i}") for i in range(5)]))
    assert out.vc_gpus["team"] == (5, 5)


def test_too_large_and_multi_gpu_pods_are_counted_as_cannot_place() -> None:
    out = ShareRecommender(settings()).recommend(0.0, pods(pod("big", 75), pod("wide", 10, workload="dp", gpus=4)))
    big = out.workloads[("serving", "llm")]
    assert big.reason == "too_large" and big.fraction is None
    assert big.share_bytes == 80 * GB and big.memory_bytes == pytest.approx(86.25 * GB)  # a whole GPU at most
    assert out.unplaced[("serving", "llm", "too_large")] == 1 and out.unplaced[("serving", "dp", "multi_gpu")] == 1
    assert out.placements[("team", "cannot_place")] == 2 and out.vc_gpus["team"] == (5, 5)


def test_missing_forecasts_never_lower_a_limit_and_drops_wait_for_the_window() -> None:
    rec = ShareRecommender(settings(sharing_stabilization_seconds=300))
    key = ("serving", "llm")
    assert rec.recommend(0, pods(pod("a", 30), pod("b", 20))).workloads[key].memory_bytes == pytest.approx(34.5 * GB)
    # b's sidecar is gone and a's forecast falls: the limit is held
    held = rec.recommend(400, pods(pod("a", 10), pod("b", None))).workloads[key]
    assert held.memory_bytes == pytest.approx(34.5 * GB) and held.memory_forecast == 10 * GB
    # every pod forecast again: lowered only to the highest of the last 300 s
    assert rec.recommend(430, pods(pod("a", 10), pod("b", 12))).workloads[key].memory_bytes == pytest.approx(34.5 * GB)
    assert rec.recommend(800, pods(pod("a", 10), pod("b", 12))).workloads[key].memory_bytes == pytest.approx(13.8 * GB)
    up = rec.recommend(830, pods(pod("a", 40), pod("b", 12))).workloads[key]  # a rise is followed at once
    assert up.memory_bytes == pytest.approx(46 * GB)


def test_mig_profiles_are_the_smallest_allowed_with_room() -> None:
    rec = ShareRecommender(settings(sharing_mode="mig", sharing_mig_profiles="1g.10gb,3g.40gb,7g.80gb"))
    out = rec.recommend(0.0, pods(pod("a", 8, 0.1), pod("b", 9, 0.1, workload="emb"), pod("c", 30, 0.2, workload="x"),
                                  pod("d", 8, 0.3, workload="busy"), pod("e", 75, workload="huge")))
    w = out.workloads
    assert w[("serving", "llm")].mig_profile == "1g.10gb"  # 9.2 GB
    assert w[("serving", "emb")].mig_profile == "3g.40gb"  # 10.35 GB: 1g.20gb is not allowed
    assert w[("serving", "x")].mig_profile == "3g.40gb"
    assert w[("serving", "busy")].mig_profile == "3g.40gb"  # 30 % of the SMs: more than 1/7
    assert w[("serving", "llm")].share_bytes == 10 * GB and w[("serving", "llm")].fraction == pytest.approx(1 / 7)
    assert w[("serving", "x")].fraction == 0.5  # 4 of 8 memory slices (3 of 7 compute slices)
    assert w[("serving", "huge")].mig_profile is None and w[("serving", "huge")].reason == "no_profile"
    assert out.unplaced[("serving", "huge", "no_profile")] == 1
    # 1g + 3g on one GPU, two 3g on another (a 3g starts at memory slice 0 or 4): 2 GPUs, huge keeps its own
    assert out.vc_gpus["team"] == (5, 3)


def test_the_memory_a_pod_sees_caps_its_share() -> None:
    out = ShareRecommender(settings()).recommend(0.0, pods(pod("a", 30, total=20 * GB)))
    share = out.workloads[("serving", "llm")]
    assert share.share_bytes == 20 * GB < share.memory_forecast  # an OOM ahead: its MIG instance is too small


def test_plan_is_sticky_across_cycles() -> None:
    rec = ShareRecommender(settings(sharing_policy="first-fit"))
    needs = [pod(f"p{i}", 20 + i, 0.1, workload=f"w{i}") for i in range(5)]
    first = rec.recommend(0, pods(*needs))
    where = dict(rec.previous)
    second = rec.recommend(30, pods(*needs))
    assert rec.previous == where and first.colocation == second.colocation


# config ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("options", "message"), [
    ({}, "sharing_gpu_model"),
    ({"sharing_gpu_model": "T4"}, "sharing_gpu_model: unknown GPU model 'T4'"),
    ({"sharing_gpu_model": "A100-40GB", "sharing_mode": "mig", "sharing_mig_profiles": "3g.40gb"},
     "sharing_mig_profiles: GPU A100-40GB has no MIG profile '3g.40gb'"),
    ({"sharing_gpu_memory_bytes": 48e9, "sharing_mode": "mig"}, "MIG-capable sharing_gpu_model"),
    ({"sharing_gpu_model": "h100", "sharing_mig_profiles": "1g.10gb"}, "needs sharing_mode mig"),
    ({"sharing_gpu_model": "h100", "sharing_memory_quantile": 0.95}, "sharing_memory_quantile"),
    ({"sharing_gpu_model": "h100", "sharing_memory_margin": -0.1}, "sharing_memory_margin"),
    ({"sharing_gpu_model": "h100", "sharing_utilization_target": 0}, "sharing_utilization_target"),
    ({"sharing_gpu_model": "h100", "sharing_gpu_memory_bytes": 40e9}, "contradicts"),
])
def test_bad_sharing_config_is_refused_naming_the_option(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ScalerConfig(sharing_enabled=True, **options).validate()


def test_sharing_section_in_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "scaler.yaml"
    path.write_text("sharing:\n  enabled: true\n  mode: mps\n  gpu_memory_bytes: 48e9\n  memory_quantile: 0.9\n")
    config = load_config({"config": str(path)}, env={})
    s = config.sharing_settings()
    assert s.mode == "mps" and s.capacity == 48e9 and s.memory_quantile == 0.9
    path.write_text("sharing:\n  enabled: true\n  gpu_model: h100\n  memory_quantil: 0.9\n")
    with pytest.raises(ValueError, match="unknown option.*sharing_memory_quantil"):
        load_config({"config": str(path)}, env={})
    assert ScalerConfig().validate().sharing_settings() is None  # off by default


# the service and its metrics ------------------------------------------------------------------------
def _prometheus(memory: dict[str, float], util: dict[str, float], totals: dict[str, float] | None = None):
    """A Prometheus API for one namespace (``serving``, also the virtual cluster): per pod the utilisation and
    memory forecasts (at horizons 60 and 300 s; the 300 s one is ``memory``, the 60 s one 1 GB less), and the
    cluster's GPUs as kube-state-metrics shows them (one per pod)."""
    def reply(path: str) -> tuple[int, str, float]:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).get("query", [""])[0]
        rows: list[tuple[dict, float]] = []
        base = {"namespace": "serving"}
        if query.startswith("dprobe_predicted_gpu_memory_bytes"):
            for p, v in memory.items():
                for h, d in (("60", 1e9), ("300", 0.0), ("900", -1e9 + 50e9)):
                    rows.append(({**base, "pod": p, "target": f"serving/{p}", "horizon_seconds": h}, v - d))
        elif "dprobe_predicted_gpu_utilization_ratio{" in query:
            rows = [({**base, "pod": p, "target": f"serving/{p}"}, v) for p, v in util.items()]
        elif query.startswith("dprobe_observed_gpu_memory_total_bytes"):
            rows = [({**base, "pod": p, "target": f"serving/{p}"}, v) for p, v in (totals or {}).items()]
        elif "DCGM" in query:
            rows = [({**base, "pod": p}, 1) for p in sorted({*memory, *util})]
        elif "kube_pod_container_resource_requests" in query:  # the virtual cluster's GPUs (kube-state-metrics)
            rows = [(base, len({*memory, *util}))]
        return 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": m, "value": [0, repr(float(v)).replace("nan", "NaN")]} for m, v in rows]}}), 0.0
    return reply


def _families(scaler: Scaler) -> dict[str, list]:
    text = generate_latest(scaler.registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_scaler_exports_shares_beside_its_unchanged_gpu_count(http_peer) -> None:
    pods_ = [f"llm-7d9f8c6b5d-{c * 5}" for c in "abcd"]
    memory = {p: 20e9 for p in pods_[:3]}  # the fourth pod has no memory forecast
    memory[pods_[0]] = float("nan")  # an unusable forecast: left out, counted
    util = {p: 0.2 for p in pods_}
    with http_peer(_prometheus(memory, util, totals={pods_[1]: 80e9})) as url:
        config = ScalerConfig(prometheus_url=url, restore_seconds=0, replicas_query="", owners_query="",
                              sharing_enabled=True, sharing_gpu_model="H100-80GB",
                              workloads=[{"namespace": "serving", "name": "llm"}])
        scaler = Scaler(config, clock=lambda: 0.0)
        scaler.cycle()
        fams = _families(scaler)
    gpus = {tuple(sorted(s.labels.items())): s.value for s in fams["dprobe_recommended_gpus"]}
    assert gpus[(("vc", "serving"),)] >= 1  # the utilisation-based count, as without sharing
    assert gpus[(("sharing", "none"), ("vc", "serving"))] == 4
    assert gpus[(("sharing", "shared"), ("vc", "serving"))] == 3  # two packed on one GPU, two keep theirs
    memory_limit = [s for s in fams["dprobe_recommended_gpu_memory_bytes"] if s.labels["workload"] == "llm"]
    assert memory_limit[0].value == pytest.approx(20e9 * 1.15)  # the 900 s horizon is beyond the scaler's 300 s
    assert [s.value for s in fams["dprobe_recommended_gpu_fraction"]] == [pytest.approx(0.29)]
    unplaced = {s.labels["reason"]: s.value for s in fams["dprobe_scaler_unplaced_pods"]}
    assert unplaced == {"no_memory_forecast": 2}
    assert sum(s.value for s in fams["dprobe_colocation_plan_pods"]) == 2
    assert scaler.reader.rejected_total["memory_nan"] == 2  # its 60 s and 300 s forecasts
    assert {s.labels["placement"]: s.value for s in fams["dprobe_scaler_sharing_pods"]} == {
        "shared": 2, "own_gpus": 2, "cannot_place": 0}


def test_without_sharing_nothing_new_is_exported(http_peer) -> None:
    with http_peer(_prometheus({"llm-7d9f8c6b5d-aaaaa": 20e9}, {"llm-7d9f8c6b5d-aaaaa": 0.2})) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, restore_seconds=0, replicas_query="", owners_query=""),
                        clock=lambda: 0.0)
        scaler.cycle()
        text = generate_latest(scaler.registry).decode()
    assert "sharing=" not in text and "dprobe_recommended_gpu_memory_bytes" not in text
    assert 'dprobe_recommended_gpus{vc="serving"} 1.0' in text


def test_a_failing_forecast_query_keeps_the_last_shares(http_peer) -> None:
    state = {"fail": False}
    good = _prometheus({"llm-7d9f8c6b5d-aaaaa": 20e9}, {"llm-7d9f8c6b5d-aaaaa": 0.2})

    def reply(path: str) -> tuple[int, str, float]:
        if state["fail"] and "dprobe_predicted_gpu_memory_bytes" in path:
            return 503, "down", 0.0
        return good(path)

    with http_peer(reply) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, restore_seconds=0, replicas_query="", owners_query="",
                                     sharing_enabled=True, sharing_gpu_memory_bytes=48e9), clock=lambda: 0.0)
        scaler.cycle()
        before = scaler.shares
        state["fail"] = True
        errors = scaler.errors_total["query"]
        scaler.cycle()
    assert scaler.shares is before and scaler.errors_total["query"] == errors + 1


def test_a_restarted_scaler_starts_from_its_last_limits_and_exports_mig_profiles(http_peer) -> None:
    pod_ = "llm-7d9f8c6b5d-aaaaa"
    forecasts = _prometheus({pod_: 20e9}, {pod_: 0.2})

    def reply(path: str) -> tuple[int, str, float]:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).get("query", [""])[0]
        if "last_over_time(dprobe_recommended_gpu_memory_bytes" in query:
            return 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {"namespace": "serving", "workload": "llm"}, "value": [0, "50e9"]}]}}), 0.0
        return forecasts(path)

    clock = iter([0.0, 100.0, 400.0])
    with http_peer(reply) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, replicas_query="", owners_query="", sharing_enabled=True,
                                     sharing_mode="mig", sharing_gpu_model="A100-80GB"),
                        clock=lambda: next(clock))
        limits = []
        for _ in range(3):
            scaler.cycle()
            limits.append(scaler.shares.workloads[("serving", "llm")])
        fams = _families(scaler)
    # 50 GB from the last run, held for the 300 s window; then the forecast's 23 GB (a 3g.40gb instance)
    assert [w.memory_bytes for w in limits] == [50e9, 50e9, pytest.approx(23e9)]
    assert [w.mig_profile for w in limits] == ["7g.80gb", "7g.80gb", "3g.40gb"]
    [info] = fams["dprobe_recommended_mig_profile_info"]
    assert info.labels == {"namespace": "serving", "workload": "llm", "profile": "3g.40gb"} and info.value == 1


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool (apt-get install prometheus)")
def test_the_share_metrics_pass_promtools_lint(http_peer) -> None:
    pods_ = {"llm-7d9f8c6b5d-aaaaa": 20e9, "emb-5f6d7c8b9a-aaaaa": 5e9}
    with http_peer(_prometheus(pods_, dict.fromkeys(pods_, 0.2))) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, restore_seconds=0, replicas_query="", owners_query="",
                                     sharing_enabled=True, sharing_mode="mig", sharing_gpu_model="H100-80GB"),
                        clock=lambda: 0.0)
        scaler.cycle()
        text = generate_latest(scaler.registry).decode()
    assert "dprobe_colocation_plan_pods{" in text and "dprobe_recommended_mig_profile_info{" in text
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr
