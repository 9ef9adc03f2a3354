"""The deployment files: manifests parse, the Prometheus rules pass promtool, the dashboard is well formed
(its PromQL runs against a real Prometheus in tests/integration)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dprobe-sidecar.json"
RULES = DEPLOY / "prometheus" / "dprobe-rules.yaml"


def dashboard_queries(dashboard: dict) -> list[str]:
    """Every PromQL expression of the dashboard's panels (rows hold none)."""
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_manifests_parse() -> None:
    """Every YAML file parses; every Kubernetes object in them has an apiVersion and a name."""
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 6
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs, path
        for doc in (d for d in docs if isinstance(d, dict) and "kind" in d):
            assert doc.get("apiVersion") and doc.get("metadata", {}).get("name"), path


def test_dockerfile_targets_copy_what_exists() -> None:
    """Without a Docker engine here: both targets are there, every file they copy exists in the repository,
    and the services target installs the requirements file and dprobe without its dependencies."""
    text = (DEPLOY / "Dockerfile").read_text()
    stages = re.findall(r"^FROM \S+ AS (\w+)$", text, re.M)
    assert stages == ["base", "services", "full"]  # the full install is the default (last) target
    root = DEPLOY.parent
    sources = [src for line in re.findall(r"^COPY (.+)$", text, re.M) for src in line.split()[:-1]]
    assert sources and all((root / src).exists() for src in sources), sources
    services = text.split("AS services")[1].split("AS full")[0]
    assert "pip install -r requirements-services.txt" in services and "pip install --no-deps ." in services
    from dprobe.lazy import FULL_INSTALL

    listed = [re.split(r"[=<>!~ ]", line)[0].lower() for line in
              (DEPLOY / "requirements-services.txt").read_text().splitlines() if line.strip() and line[0] != "#"]
    assert "onnxruntime" in listed and not set(listed) & set(FULL_INSTALL.values())


def test_dashboard_is_well_formed() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "namespace", "pod", "horizon"} <= variables
    for panel in board["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    for expr in dashboard_queries(board):
        used = set(re.findall(r"\$\{?(\w+)", expr)) - {"__rate_interval"}
        assert used <= variables, expr  # no variable the dashboard does not define
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool (apt-get install prometheus)")
def test_prometheus_rules_pass_promtool() -> None:
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    # unit tests: the alerts fire (and only then) on the series they are written for
    test = subprocess.run(["promtool", "test", "rules", RULES.with_suffix(".test.yaml").name],
                          capture_output=True, text=True, cwd=RULES.parent)
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr


def _objects(path: Path) -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(path.read_text()) if d}


def test_scaler_manifests_match_the_scaler(tmp_path: Path) -> None:
    """The ConfigMap is a valid scaler config, the Deployment's arguments parse as `dprobe scaler` flags and
    its port is the config's, and the RBAC grants what apply mode calls (get and patch on the scales)."""
    from dprobe.cli import build_parser
    from dprobe.scaler.config import load_config

    scaler = DEPLOY / "scaler"
    config_map = _objects(scaler / "configmap.yaml")["ConfigMap"]
    path = tmp_path / "scaler.yaml"
    path.write_text(config_map["data"]["scaler.yaml"])
    config = load_config({"config": str(path)}, env={})
    assert [s.key for s in config.workload_specs()] == [("serving", "llm-server")]
    deployment = _objects(scaler / "deployment.yaml")["Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "scaler" and args.config == "/etc/dprobe/scaler.yaml"
    assert container["ports"][0]["containerPort"] == config.port
    assert container["volumeMounts"][0]["mountPath"] == args.config
    rbac = _objects(scaler / "rbac.yaml")
    granted = {(group, resource, verb) for rule in rbac["ClusterRole"]["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    needed = {("apps", f"{kind}/scale", verb) for kind in ("deployments", "statefulsets") for verb in ("get", "patch")}
    assert granted == needed | {("", "resourcequotas", "get"), ("", "resourcequotas", "patch"), ("", "events", "create")}
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == rbac["ServiceAccount"]["metadata"]["name"]
