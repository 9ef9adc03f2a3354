"""`kubectl apply -k deploy/` and its overlays: every kustomization renders with kubectl's kustomize, and every
object it renders validates against its schema (Kubernetes' own from kubernetes-validate, the Prometheus
Operator's and KEDA's CRDs from tests/schemas, unknown fields refused as `kubectl apply --validate=strict`
refuses them); the dashboards are Grafana's ConfigMaps, the rules a PrometheusRule with the same rules
as deploy/prometheus/dprobe-rules.yaml (which promtool tests), the monitors carry kube-prometheus-stack's
release label, and deploy/README.md names every file of deploy/.

``python tests/test_kustomize.py --write-prometheusrule`` rewrites deploy/prometheus/prometheusrule.yaml from
dprobe-rules.yaml."""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
RULES = DEPLOY / "prometheus" / "dprobe-rules.yaml"
PROMETHEUS_RULE = DEPLOY / "prometheus" / "prometheusrule.yaml"
KUBERNETES_VERSION = "1.30"  # the oldest Kubernetes the manifests are checked against
# the kustomizations a user applies (components are rendered through them)
KUSTOMIZATIONS = {"default": DEPLOY, "node-agent": DEPLOY / "overlays" / "node-agent",
                  "sidecar": DEPLOY / "overlays" / "sidecar"}
# components a user adds to kustomizations of their own (rendered here on example workloads)
USER_COMPONENTS = [DEPLOY / "components" / "sidecar", DEPLOY / "components" / "scaler-shards"]
CRDS = {"PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
        "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
        "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
        "ScaledObject": "keda.sh_scaledobjects.yaml"}
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"

needs_kubectl = pytest.mark.skipif(not Path(KUBECTL).exists(), reason="no kubectl (its kustomize renders deploy/)")


# -- the PrometheusRule, made from dprobe-rules.yaml ---------------------------------------------------------


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (PromQL) as literal blocks, as written by hand."""


_BlockDumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s,
                                                                  style="|" if "\n" in s else None))


def prometheus_rule(rules_file: Path = RULES) -> dict:
    """The PrometheusRule (monitoring.coreos.com/v1) holding ``rules_file``'s groups, unchanged."""
    groups = yaml.safe_load(rules_file.read_text())["groups"]
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "dprobe", "namespace": "monitoring",
                         "labels": {"app.kubernetes.io/name": "dprobe", "app.kubernetes.io/component": "rules"}},
            "spec": {"groups": groups}}


def write_prometheus_rule() -> None:
    header = ("# Generated from dprobe-rules.yaml by `python tests/test_kustomize.py --write-prometheusrule`: edit the\n"
              "# rules there (promtool tests them: dprobe-rules.test.yaml), then rerun it. tests/test_kustomize.py\n"
              "# fails while the two differ.\n")
    PROMETHEUS_RULE.write_text(header + yaml.dump(prometheus_rule(), Dumper=_BlockDumper, sort_keys=False,
                                                  width=110, allow_unicode=True))


# -- rendering and schemas ----------------------------------------------------------------------------------


@functools.cache
def render(path: Path) -> tuple[dict, ...]:
    """The objects ``kubectl kustomize path`` renders."""
    out = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def _by_kind(objects: tuple[dict, ...]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def _strict(schema: object) -> object:
    """A CRD's OpenAPI v3 schema as JSON Schema, strict: an object with properties refuses any other field
    (as the API server's strict field validation does), int-or-string is either."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schema(kind: str) -> tuple[str, dict]:
    """(apiVersion, strict JSON schema) of a custom resource kind, from its CRD in tests/schemas."""
    crd = next(d for d in yaml.safe_load_all((SCHEMAS / CRDS[kind]).read_text()) if d)
    assert crd["spec"]["names"]["kind"] == kind
    [version] = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return f"{crd['spec']['group']}/{version['name']}", _strict(version["schema"]["openAPIV3Schema"])


def schema_errors(obj: dict) -> list[str]:
    """Where ``obj`` breaks its schema: a custom resource its CRD's, anything else Kubernetes' (strict)."""
    import jsonschema
    import kubernetes_validate

    if obj["kind"] in CRDS:
        api_version, schema = crd_schema(obj["kind"])
        if obj["apiVersion"] != api_version:
            return [f"apiVersion {obj['apiVersion']}, not {api_version}"]
        validator = jsonschema.Draft7Validator(schema)
        return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(map(str, e.path))}: {e.message}"]
    return []


# -- the tests ----------------------------------------------------------------------------------------------


@needs_kubectl
@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_every_rendered_object_validates_against_its_schema(name: str) -> None:
    objects = render(KUSTOMIZATIONS[name])
    assert objects
    for obj in objects:
        assert schema_errors(obj) == [], (name, obj["kind"], obj["metadata"]["name"])
        assert obj["metadata"].get("namespace"), (name, obj["kind"], obj["metadata"]["name"])  # none by accident


def test_the_schema_check_refuses_what_the_api_server_would() -> None:
    """Unknown fields and wrong types are errors, for built-in kinds and custom resources alike."""
    deployment = next(d for d in yaml.safe_load_all((DEPLOY / "scaler" / "deployment.yaml").read_text())
                      if d["kind"] == "Deployment")
    monitor = yaml.safe_load((DEPLOY / "sidecar" / "podmonitor.yaml").read_text())
    assert schema_errors(deployment) == [] and schema_errors(monitor) == []
    bad = copy.deepcopy(deployment)
    bad["spec"]["replicas"] = "one"
    assert schema_errors(bad)
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}  # misspelt: unknown field
    assert schema_errors(bad)
    bad = copy.deepcopy(monitor)
    bad["spec"]["podMetricsEndpoints"][0]["honorlabels"] = True
    assert schema_errors(bad)
    bad = copy.deepcopy(monitor)
    bad["spec"]["podMetricsEndpoints"][0]["honorLabels"] = "true"
    assert schema_errors(bad)
    # a ServiceMonitor (for a scaler behind a Service, instead of its PodMonitor) is checked the same way
    service_monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                       "metadata": {"name": "dprobe-scaler", "namespace": "monitoring"},
                       "spec": {"selector": {"matchLabels": {"app.kubernetes.io/component": "scaler"}},
                                "endpoints": [{"port": "dprobe-metrics", "honorLabels": True}]}}
    assert schema_errors(service_monitor) == []
    service_monitor["spec"]["endpoints"][0]["podMetricsEndpoints"] = []
    assert schema_errors(service_monitor)
    rule = prometheus_rule()
    assert schema_errors(rule) == []
    rule["spec"]["groups"][0]["rules"][0]["expression"] = "up"
    assert schema_errors(rule)


@needs_kubectl
def test_default_install_is_scaler_node_agent_dashboards_and_rules() -> None:
    objects = _by_kind(render(DEPLOY))
    assert {("Deployment", "dprobe-scaler"), ("DaemonSet", "dprobe-node"), ("PodMonitor", "dprobe-sidecar"),
            ("PodMonitor", "dprobe-scaler"), ("PrometheusRule", "dprobe"), ("NetworkPolicy", "dprobe-node"),
            ("NetworkPolicy", "dprobe-scaler"), ("ConfigMap", "dprobe-scaler")} <= set(objects)
    # everything in one namespace; nothing of the examples (workload namespaces, apply-mode RBAC, KEDA)
    assert {o["metadata"]["namespace"] for o in objects.values()} == {"monitoring"}
    assert not [k for k in objects if k[0] in ("ScaledObject", "Pod")]
    # the scaler in recommend mode, two replicas electing a leader: the only Role is the Lease's
    assert [k for k in objects if k[0] in ("Role", "RoleBinding", "ServiceAccount")] == [
        ("ServiceAccount", "dprobe-scaler"), ("Role", "dprobe-scaler-lease"), ("RoleBinding", "dprobe-scaler-lease")]
    assert {r["resources"][0] for r in objects[("Role", "dprobe-scaler-lease")]["rules"]} == {"leases"}
    deployment = objects[("Deployment", "dprobe-scaler")]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "dprobe-scaler" and pod["automountServiceAccountToken"] is True
    assert deployment["spec"]["replicas"] == 2 and deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "leader_election: true" in objects[("ConfigMap", "dprobe-scaler")]["data"]["scaler.yaml"]
    budget = objects[("PodDisruptionBudget", "dprobe-scaler")]["spec"]
    assert budget["minAvailable"] == 1
    assert budget["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


@needs_kubectl
def test_the_node_agents_egress_is_its_source_and_dns() -> None:
    """The installed node agent may connect out to dcgm-exporter's port (the one its URL names) and to
    kube-dns (UDP and TCP 53) only: its policy covers Egress, not only Ingress."""
    objects = _by_kind(render(DEPLOY))
    policy = objects[("NetworkPolicy", "dprobe-node")]["spec"]
    [agent] = objects[("DaemonSet", "dprobe-node")]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["DPROBE_SIDECAR_SOURCE"] == "dcgm"
    port = int(re.search(r":(\d+)/metrics$", env["DPROBE_SIDECAR_DCGM_URL"]).group(1))
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    source, dns = policy["egress"]
    assert source == {"ports": [{"protocol": "TCP", "port": port}]}
    assert dns["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                          "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]
    assert sorted((p["protocol"], p["port"]) for p in dns["ports"]) == [("TCP", 53), ("UDP", 53)]


@needs_kubectl
@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_dashboards_are_grafana_configmaps_of_the_json_files(name: str) -> None:
    maps = [o for o in render(KUSTOMIZATIONS[name]) if o["kind"] == "ConfigMap"
            and o["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    files = {p.name: p.read_text() for p in (DEPLOY / "grafana").glob("*.json")}
    assert len(files) == 2
    assert {k: v for m in maps for k, v in m["data"].items()} == files
    for m in maps:
        assert m["metadata"]["namespace"] == "monitoring"
        [board] = [json.loads(v) for v in m["data"].values()]
        assert board["uid"]


def test_prometheus_rule_holds_the_same_rules_as_the_promtool_tested_file() -> None:
    """deploy/prometheus/prometheusrule.yaml (what -k installs) and dprobe-rules.yaml (what promtool tests and
    plain Prometheus loads) hold the same groups, rule for rule."""
    kept = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert kept == prometheus_rule(), "rerun: python tests/test_kustomize.py --write-prometheusrule"
    assert [r.get("alert") or r["record"] for g in kept["spec"]["groups"] for r in g["rules"]] == [
        r.get("alert") or r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


@needs_kubectl
@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_monitors_and_rules_carry_the_release_label(name: str) -> None:
    found = [o for o in render(KUSTOMIZATIONS[name]) if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {o["kind"] for o in found} == {"PodMonitor", "PrometheusRule"}
    assert all(o["metadata"]["labels"]["release"] == "kube-prometheus-stack" for o in found)
    # the label only: the pods' labels and selectors are untouched
    for o in render(KUSTOMIZATIONS[name]):
        if o["kind"] in ("Deployment", "DaemonSet"):
            assert "release" not in o["spec"]["selector"]["matchLabels"]
            assert "release" not in o["spec"]["template"]["metadata"]["labels"]


@needs_kubectl
def test_release_label_changes_in_an_overlay(tmp_path: Path) -> None:
    """Another Helm release name: one patch in your own overlay, as overlays/node-agent shows."""
    overlay = (KUSTOMIZATIONS["node-agent"] / "kustomization.yaml").read_text()
    (tmp_path / "deploy").symlink_to(DEPLOY)  # a copy of the overlay beside deploy/, as in a user's repository
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "kustomization.yaml").write_text(
        overlay.replace("../../", "../deploy/").replace("value: kube-prometheus-stack", "value: prom-main"))
    found = [o for o in render(tmp_path / "mine") if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert len(found) == 3 and {o["metadata"]["labels"]["release"] for o in found} == {"prom-main"}


@needs_kubectl
def test_overlays_pick_the_sidecar_mode_and_keda() -> None:
    default, node_agent, sidecar = (_by_kind(render(KUSTOMIZATIONS[k])) for k in ("default", "node-agent", "sidecar"))
    # per-pod sidecars: no node agent nor its policy; the PodMonitor that scrapes the sidecars stays
    assert set(default) - set(sidecar) == {("DaemonSet", "dprobe-node"), ("NetworkPolicy", "dprobe-node")}
    assert sidecar[("PodMonitor", "dprobe-sidecar")] == default[("PodMonitor", "dprobe-sidecar")]
    # KEDA is optional: only the overlay that asks for it has a ScaledObject, the one following the scaler
    assert set(node_agent) - set(default) == {("ScaledObject", "llm-server-dprobe")}
    trigger = node_agent[("ScaledObject", "llm-server-dprobe")]["spec"]["triggers"][0]["metadata"]
    assert "dprobe_recommended_replicas" in trigger["query"]
    # the node agent's pods are what the sidecar PodMonitor selects
    monitor = default[("PodMonitor", "dprobe-sidecar")]["spec"]["selector"]["matchLabels"]
    labels = default[("DaemonSet", "dprobe-node")]["spec"]["template"]["metadata"]["labels"]
    assert monitor.items() <= labels.items()


WORKLOADS = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: llm-server, labels: {app: llm-server, dprobe.io/sidecar: "true"}}
spec:
  selector: {matchLabels: {app: llm-server}}
  template:
    metadata: {labels: {app: llm-server}}
    spec:
      automountServiceAccountToken: true
      containers: [{name: server, image: "registry.example.com/llm:1", resources: {limits: {nvidia.com/gpu: 1}}}]
      volumes: [{name: cache, emptyDir: {}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: kv, labels: {app: kv, dprobe.io/sidecar: "true"}}
spec:
  serviceName: kv
  selector: {matchLabels: {app: kv}}
  template:
    metadata: {labels: {app: kv}}
    spec:
      containers: [{name: kv, image: "kv:1"}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, labels: {app: web}}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: "web:1"}]
"""


@needs_kubectl
def test_sidecar_component_adds_the_sidecar_to_labelled_workloads(tmp_path: Path) -> None:
    """A user's kustomization with components/sidecar: each Deployment or StatefulSet labelled
    dprobe.io/sidecar gets the container of sidecar-container.yaml after its own, the volumes it mounts, the
    pod label the PodMonitor selects and a ConfigMap of sidecar.yaml in its namespace; others stay as they
    were; everything validates."""
    (tmp_path / "deploy").symlink_to(DEPLOY)
    app = tmp_path / "app"
    app.mkdir()
    (app / "workloads.yaml").write_text(WORKLOADS)
    (app / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: serving\n"
        "resources: [workloads.yaml]\ncomponents: [../deploy/components/sidecar]\n")
    objects = _by_kind(render(app))
    for obj in objects.values():
        assert schema_errors(obj) == [], obj["metadata"]["name"]
    [config_map] = [o for k, o in objects.items() if k[0] == "ConfigMap"]
    assert config_map["metadata"]["namespace"] == "serving"
    assert config_map["data"] == yaml.safe_load((DEPLOY / "sidecar" / "configmap.yaml").read_text())["data"]
    [snippet] = yaml.safe_load((DEPLOY / "sidecar" / "sidecar-container.yaml").read_text())
    monitor = yaml.safe_load((DEPLOY / "sidecar" / "podmonitor.yaml").read_text())["spec"]["selector"]["matchLabels"]
    for key, own in ((("Deployment", "llm-server"), "server"), (("StatefulSet", "kv"), "kv")):
        template = objects[key]["spec"]["template"]
        pod = template["spec"]
        assert [c["name"] for c in pod["containers"]] == [own, "dprobe-sidecar"]  # the workload's stays first
        assert pod["containers"][1] == snippet
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert {m["name"] for m in snippet["volumeMounts"]} <= set(volumes)
        assert volumes["dprobe-config"]["configMap"]["name"] == config_map["metadata"]["name"]  # hashed name
        assert monitor.items() <= template["metadata"]["labels"].items()
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "cache" in {v["name"] for v in objects[("Deployment", "llm-server")]["spec"]["template"]["spec"]["volumes"]}
    web = objects[("Deployment", "web")]
    assert [c["name"] for c in web["spec"]["template"]["spec"]["containers"]] == ["web"]
    assert "volumes" not in web["spec"]["template"]["spec"]


def _referenced(kustomization_dir: Path) -> set[Path]:
    """The files a kustomization (or component) reads, its own file and those of the folders it includes."""
    doc = yaml.safe_load((kustomization_dir / "kustomization.yaml").read_text())
    found = {kustomization_dir / "kustomization.yaml"}
    for entry in doc.get("resources", []) + doc.get("components", []):
        path = (kustomization_dir / entry).resolve()
        found |= _referenced(path) if path.is_dir() else {path}
    for gen in doc.get("configMapGenerator", []):
        found |= {(kustomization_dir / f.split("=")[-1]).resolve() for f in gen.get("files", [])}
    found |= {(kustomization_dir / p["path"]).resolve() for p in doc.get("patches", []) if "path" in p}
    return found


@needs_kubectl
def test_scaler_shards_component_names_the_leases_the_scaler_uses(tmp_path: Path) -> None:
    """components/scaler-shards: the shards the scaler is told (its environment over the ConfigMap), at least as
    many replicas, minAvailable one below them, and the Role naming exactly the Leases those shards use."""
    from dprobe.services.scaler.config import ENV_PREFIX
    from dprobe.services.scaler.shards import members_lease_name, shard_lease_names

    (tmp_path / "deploy").symlink_to(DEPLOY)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "kustomization.yaml").write_text(
        "resources: [../deploy/scaler]\ncomponents: [../deploy/components/scaler-shards]\n")
    objects = render(tmp_path / "mine")
    for obj in objects:
        assert not schema_errors(obj), (obj["kind"], schema_errors(obj))
    found = _by_kind(objects)
    deployment = found[("Deployment", "dprobe-scaler")]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    shards = int(env[f"{ENV_PREFIX}SHARDS"])
    config = yaml.safe_load(found[("ConfigMap", "dprobe-scaler")]["data"]["scaler.yaml"])
    assert shards > 1 and config["leader_election"] is True
    lease = config.get("leader_election_lease_name", "dprobe-scaler")
    replicas = deployment["spec"]["replicas"]
    assert replicas >= shards
    assert found[("PodDisruptionBudget", "dprobe-scaler")]["spec"]["minAvailable"] == replicas - 1
    rules = found[("Role", "dprobe-scaler-lease")]["rules"]
    named = [r for r in rules if r.get("resourceNames")]
    assert len(named) == 1 and set(named[0]["verbs"]) == {"get", "update"}
    assert named[0]["resourceNames"] == [*shard_lease_names(lease, shards), members_lease_name(lease)]


def test_deploy_readme_names_every_file_and_what_k_does_not_install() -> None:
    """`kubectl apply -k` is the one way to install (deploy/ also holds dashboards' JSON, rule files, patches
    and examples that `kubectl apply -R -f` would trip over): deploy/README.md names every file there, and
    says of each one no kustomization reads what it is for."""
    readme = (DEPLOY / "README.md").read_text()
    assert "kubectl apply -k deploy/" in readme
    files = {p for p in DEPLOY.rglob("*") if p.is_file() and p.name != "README.md"}
    assert len(files) >= 25
    missing = sorted(str(p.relative_to(DEPLOY)) for p in files if f"`{p.relative_to(DEPLOY)}`" not in readme)
    assert not missing, missing
    used = set().union(*(_referenced(k) for k in [*KUSTOMIZATIONS.values(), *USER_COMPONENTS]))
    assert used <= files  # every file a kustomization names exists
    section = readme.split("## Not installed by -k")[1]
    left = sorted(str(p.relative_to(DEPLOY)) for p in files - used)
    assert left and all(f"`{name}`" in section for name in left), left
    assert not [name for name in re.findall(r"`([^`]+\.(?:yaml|json))`", section) if (DEPLOY / name) in used]


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-prometheusrule"]:
        write_prometheus_rule()
        print(f"wrote {PROMETHEUS_RULE.relative_to(ROOT)}")
    else:
        sys.exit("usage: python tests/test_kustomize.py --write-prometheusrule")
