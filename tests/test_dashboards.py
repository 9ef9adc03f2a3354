"""The Grafana dashboards, read as an SRE reads them: one unit per panel (never bytes beside ratios; demand and
capacity in the same unit), the forecasts' quantiles as shaded bands, the workload's real replicas from
kube-state-metrics beside the recommendation, and dcgm-exporter's collection interval said where it shows.
Their queries run against a real Prometheus in tests/integration/test_dashboards_live.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

GRAFANA = Path(__file__).resolve().parent.parent / "deploy" / "grafana"
BOARDS = sorted(GRAFANA.glob("*.json"))
METRIC = re.compile(r"\b((?:dprobe[_:]|DCGM_FI_|kube_)[A-Za-z0-9_:]+)")
# a sum of utilisation ratios over pods: how many replicas the load fills at 100 %, a count of replicas
COUNT_DESPITE_NAME = {"dprobe_scaler_demand_ratio"}


def _board(name: str) -> dict:
    return json.loads((GRAFANA / name).read_text())


def _panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def unit_of(metric: str) -> str:
    """The unit a metric's values are in, by the Prometheus naming conventions dprobe follows."""
    name = metric.split(":")[1] if metric.startswith("dprobe:") else metric
    if metric in COUNT_DESPITE_NAME:
        return "count"
    if name.endswith("_bytes") or name.startswith("DCGM_FI_DEV_FB_"):  # dcgm-exporter's MiB, times 1048576
        return "bytes"
    if name.endswith("_ratio") or name.startswith("DCGM_FI_DEV_GPU_UTIL"):
        return "percentunit"
    if re.search(r"_seconds(_bucket|_sum|_count)?$", name):
        return "s"
    return "count"


def _panel_unit(panel: dict) -> str:
    unit = panel["fieldConfig"]["defaults"]["unit"]
    return "count" if unit in ("short", "none") else unit


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.name)
def test_dashboard_is_well_formed(path: Path) -> None:
    board = json.loads(path.read_text())
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in board["templating"]["list"]}
    for panel in board["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            assert "repeat" not in panel or panel["repeat"] in variables
            continue
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
        for t in panel["targets"]:
            used = set(re.findall(r"\$\{?(\w+)", t["expr"])) - {"__rate_interval"}
            assert used <= variables, t["expr"]  # no variable the dashboard does not define
            assert t["expr"].count("(") == t["expr"].count(")") and t["expr"].count("{") == t["expr"].count("}")


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.name)
def test_one_unit_per_panel(path: Path) -> None:
    """Each panel has one unit, which no override changes, and every series it plots directly is in that unit
    (arithmetic that makes a ratio, a division or a comparison, is the panel's to declare)."""
    checked = 0
    for panel in _panels(json.loads(path.read_text())):
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        assert not [p for o in panel["fieldConfig"]["overrides"] for p in o["properties"] if p["id"] == "unit"]
        for target in panel["targets"]:
            expr = target["expr"]
            if "/" in expr or " bool " in expr:
                continue
            metrics = {m for m in METRIC.findall(expr) if not m.endswith("_info")}
            assert {unit_of(m) for m in metrics} == {_panel_unit(panel)}, (panel["title"], expr)
            checked += 1
    assert checked >= 10


def test_unit_check_tells_bytes_from_ratios() -> None:
    assert [unit_of(m) for m in ("dprobe_predicted_gpu_memory_bytes", "dprobe_observed_gpu_utilization_ratio",
                                 "dprobe:predicted_gpu_memory_headroom_ratio:p90", "dprobe_forecast_seconds_bucket",
                                 "kube_deployment_spec_replicas", "dprobe_scaler_demand_ratio")] == [
        "bytes", "percentunit", "percentunit", "s", "count", "count"]


def test_forecast_quantiles_are_shaded_bands() -> None:
    """The sidecar's forecast panels fill p50 to p90 and p90 to p99 (Grafana's fillBelowTo), the series named
    for their quantile; a row repeated per pod keeps those names unique within each panel."""
    board = _board("dprobe-sidecar.json")
    [row] = [p for p in board["panels"] if p["type"] == "row" and p.get("repeat")]
    assert row["repeat"] == "pod"
    forecast = [p for p in _panels(board) if "observed and the forecast made" in p["title"]]
    assert [p["fieldConfig"]["defaults"]["unit"] for p in forecast] == ["bytes", "percentunit"]
    for panel in forecast:
        legends = {t["legendFormat"]: t["expr"] for t in panel["targets"]}
        assert set(legends) == {"observed", "p50", "p90", "p99"}
        for level, quantile in (("p50", "0.5"), ("p90", "0.9"), ("p99", "0.99")):
            assert f'quantile="{quantile}"' in legends[level] and "offset ${horizon}s" in legends[level]
            assert legends[level].startswith("max by (namespace, pod)")  # one series per pod however many sidecars
        fills = {o["matcher"]["options"]: {p["id"]: p["value"] for p in o["properties"]}
                 for o in panel["fieldConfig"]["overrides"]}
        assert fills["p90"]["custom.fillBelowTo"] == "p50" and fills["p99"]["custom.fillBelowTo"] == "p90"
        assert fills["p90"]["custom.fillOpacity"] > fills["p99"]["custom.fillOpacity"] > 0
        assert "DCGM_EXPORTER_INTERVAL" in panel["description"] and "--collect-interval" in panel["description"]


def test_real_replicas_beside_the_recommendation() -> None:
    """What the workload runs (kube-state-metrics, Deployments and StatefulSets) beside what dprobe
    recommends; the scaler's own previous count is not shown as if it were the workload's."""
    board = _board("dprobe-scaler.json")
    text = json.dumps(board)
    assert "dprobe_scaler_current_replicas" not in text
    [replicas] = [p for p in _panels(board) if p["title"].startswith("Replicas")]
    metrics = {m for t in replicas["targets"] for m in METRIC.findall(t["expr"])}
    assert {"dprobe_recommended_replicas", "kube_deployment_spec_replicas", "kube_deployment_status_replicas_available",
            "kube_statefulset_replicas", "kube_statefulset_status_replicas_ready"} <= metrics
    # demand and capacity, one unit: replicas' worth at 100 % GPU, beside the replicas running and recommended
    [demand] = [p for p in _panels(board) if "demand against capacity" in p["title"]]
    assert {unit_of(m) for t in demand["targets"] for m in METRIC.findall(t["expr"])} == {"count"}
    assert "kube_deployment_status_replicas_available" in json.dumps(demand["targets"])


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool (apt-get install prometheus)")
def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    """Every panel's expression, its variables set as Grafana sets them, is PromQL that Prometheus parses
    (promtool reads them as recording rules); tests/integration/test_dashboards_live.py runs them."""
    values = {"datasource": "x", "namespace": ".*", "pod": ".*", "workload": ".*", "vc": ".*", "horizon": "300",
              "__rate_interval": "1m"}
    rules = [{"record": f"dashboard:{path.stem.replace('-', '_')}:{i}",
              "expr": re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], target["expr"])}
             for path in BOARDS for i, target in enumerate(t for p in _panels(json.loads(path.read_text()))
                                                           for t in p["targets"])]
    assert len(rules) >= 30
    bad = {"record": "dashboard:bad", "expr": "sum(rate(x[1m])) / on (a) group_left (label_join(y, \"b\", \"\", \"c\"))"}
    for found, expected in ((rules, 0), ([*rules, bad], 1)):  # the check itself refuses a parse error
        (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": found}]}))
        check = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True,
                               text=True, timeout=60)
        assert check.returncode == expected, check.stdout + check.stderr
