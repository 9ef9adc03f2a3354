"""The deployment files: manifests parse, the Prometheus rules pass promtool, the pods run without privileges
(the dashboards: tests/test_dashboards.py; the kustomizations: tests/test_kustomize.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
RULES = DEPLOY / "prometheus" / "dprobe-rules.yaml"


def test_manifests_parse() -> None:
    """Every YAML file parses; every Kubernetes object in them has an apiVersion and a name (kustomizations
    aside: tests/test_kustomize.py renders them)."""
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 6
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs, path
        for doc in (d for d in docs if isinstance(d, dict) and "kind" in d and path.name != "kustomization.yaml"):
            assert doc.get("apiVersion") and doc.get("metadata", {}).get("name"), path


def test_dockerfile_targets_copy_what_exists() -> None:
    """Without a Docker engine here: both targets are there, every file they copy exists in the repository,
    the services target installs dprobe's base requirements and the scaler extra, the full one also the train
    extra, both with
    requirements.lock as pip's constraints (what pyproject.toml's lists hold: tests/test_services_install.py)."""
    text = (DEPLOY / "Dockerfile").read_text()
    stages = re.findall(r"^FROM \S+ AS (\w+)$", text, re.M)
    assert stages == ["base", "services", "full"]  # the full install is the default (last) target
    root = DEPLOY.parent
    sources = [src for line in re.findall(r"^COPY (.+)$", text, re.M) for src in line.split()[:-1]]
    assert sources and all((root / src).exists() for src in sources), sources
    services = text.split("AS services")[1].split("AS full")[0]
    full = text.split("AS full")[1]
    for stage in (services, full):
        assert re.search(r"^COPY .*\brequirements\.lock\b", stage, re.M), stage
    installs = [re.findall(r"^RUN pip install (.+)$", stage, re.M) for stage in (services, full)]
    assert installs[0] == ["-c requirements.lock '.[scaler]'"], installs  # the base and the scaler's: no torch
    assert len(installs[1]) == 1 and installs[1][0].startswith("-c requirements.lock ") \
        and installs[1][0].endswith(" '.[train,scaler]'"), installs
    assert "--no-deps" not in text
    for stage in (services, full):  # the dependencies in a layer before the source, from pyproject.toml's lists
        deps = stage.index("-r /tmp/requirements.txt")
        assert deps < stage.index("COPY dprobe ./dprobe") < stage.index("RUN pip install -c requirements.lock")


def test_dockerfile_dependency_layers_install_pyproject_lists(tmp_path) -> None:
    """The two RUN lines that write /tmp/requirements.txt, run here against pyproject.toml, list exactly the
    base requirements and the scaler extra (services), and those plus the train extra (full)."""
    import tomllib

    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", "")
    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    want = {"services": project["dependencies"] + extras["scaler"],
            "full": project["dependencies"] + extras["train"] + extras["scaler"]}
    for stage, code in zip(("services", "full"), re.findall(r'RUN python -c "(.+?)"\s*> /tmp/requirements.txt', text),
                           strict=True):
        got = subprocess.run([sys.executable, "-c", code], cwd=DEPLOY.parent, capture_output=True, text=True, check=True)
        assert got.stdout.split("\n")[:-1] == want[stage]
    ignored = (DEPLOY.parent / ".dockerignore").read_text().split()
    assert ".venv/" in ignored and ".git/" in ignored and "datasets/" not in ignored


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool (apt-get install prometheus)")
def test_prometheus_rules_pass_promtool() -> None:
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    # unit tests: the alerts fire (and only then) on the series they are written for
    test = subprocess.run(["promtool", "test", "rules", RULES.with_suffix(".test.yaml").name],
                          capture_output=True, text=True, cwd=RULES.parent)
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr


def test_the_rules_record_the_series_the_scaler_reads() -> None:
    """recorded_series reads what the rules' group dprobe-scaler-workloads records, each name there once."""
    from dprobe.services.scaler.demand import RECORDED_NAMESPACE, RECORDED_REQUESTED_GPUS, RECORDED_WORKLOAD

    groups = {g["name"]: g for g in yaml.safe_load(RULES.read_text())["groups"]}
    recorded = [r["record"] for r in groups["dprobe-scaler-workloads"]["rules"] if "record" in r]
    assert {*RECORDED_WORKLOAD.values(), *RECORDED_NAMESPACE.values(), RECORDED_REQUESTED_GPUS} <= set(recorded)
    assert len(recorded) == len(set(recorded))


def _objects(path: Path) -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(path.read_text()) if d}


def _granted(path: Path) -> set[tuple[str, str, str, str, str]]:
    """(namespace, API group, resource, name or "*", verb) that the Roles of ``path`` grant the scaler's service
    account through their RoleBindings; no cluster-wide role or binding, no role left unbound."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")], path
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in docs if d["kind"] == "Role"}
    bound = set()
    for binding in (d for d in docs if d["kind"] == "RoleBinding"):
        assert binding["roleRef"]["kind"] == "Role" and binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "dprobe-scaler", "namespace": "monitoring"}], path
        bound.add((binding["metadata"]["namespace"], binding["roleRef"]["name"]))
    assert bound == set(roles), path
    return {(ns, group, resource, name, verb) for (ns, _), role in roles.items() for rule in role["rules"]
            for group in rule["apiGroups"] for resource in rule["resources"]
            for name in rule.get("resourceNames", ["*"]) for verb in rule["verbs"]}


def test_scaler_manifests_match_the_scaler(tmp_path: Path) -> None:
    """The ConfigMap is a valid scaler config, the Deployment's arguments parse as `dprobe scaler` flags and
    its port is the config's, and the RBAC grants what apply mode calls (get and patch on the scales)."""
    from dprobe.cli import build_parser
    from dprobe.services.scaler.config import load_config

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
    # least privilege: get / patch on each listed workload's own scale, Events, in its namespace only
    specs = config.workload_specs()
    assert _granted(scaler / "rbac.yaml") == (
        {(s.namespace, "apps", f"{s.kind.lower()}s/scale", s.name, verb) for s in specs for verb in ("get", "patch")}
        | {(s.namespace, "", "events", "*", "create") for s in specs})
    # leader election, on in the deployed config: the Lease it names, in the scaler's namespace, and nothing else
    assert config.leader_election and deployment["spec"]["replicas"] == 2
    namespace = deployment["metadata"]["namespace"]
    assert _granted(scaler / "rbac-lease.yaml") == {
        (namespace, "coordination.k8s.io", "leases", config.leader_election_lease_name, verb)
        for verb in ("get", "update")} | {(namespace, "coordination.k8s.io", "leases", "*", "create")}
    # the quota rule, apart (only with vc_quota_name): the named quota of each virtual cluster's namespace
    quota = re.search(r"vc_quota_name: (\S+)", config_map["data"]["scaler.yaml"]).group(1)
    assert _granted(scaler / "rbac-quota.yaml") == {("team-a", "", "resourcequotas", quota, verb) for verb in
                                                   ("get", "patch")} | {("team-a", "", "events", "*", "create")}


def _pod_container_lists(doc: object) -> list[list[dict]]:
    """The container lists of the pods a manifest describes (a Pod's, a workload template's, wherever they
    nest), or the manifest itself when it is a bare list of containers (a snippet to add to a pod)."""
    if isinstance(doc, list):
        return [doc] if doc and all(isinstance(c, dict) and "image" in c for c in doc) else []
    if not isinstance(doc, dict):
        return []
    own = [doc["containers"]] if isinstance(doc.get("containers"), list) else []
    return own + [found for value in doc.values() if isinstance(value, dict) for found in _pod_container_lists(value)]


def test_no_readiness_gate_from_the_sidecar_on_a_workloads_pod() -> None:
    """A sidecar next to a workload (a Pod with other containers, or the snippet added to one) has no readiness
    probe that depends on its metrics source: /readyz failing would take the workload out of its Service; nor
    has the per-node agent, whose DaemonSet's rolling update would stall on a node whose dcgm-exporter is down."""
    checked = 0
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for containers in _pod_container_lists(doc):
                sidecars = [c for c in containers if (c.get("args") or [None])[0] == "sidecar"]
                if not sidecars:
                    continue  # dprobe's own per-node DaemonSet is checked too: an unready pod stalls its rollout
                for c in sidecars:
                    checked += 1
                    probe = c.get("readinessProbe")
                    assert probe is None or probe.get("httpGet", {}).get("path") == "/healthz", (path, c["name"])
                    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", (path, c["name"])
    assert checked >= 3  # example-pod.yaml, sidecar-container.yaml and the node agent


def _docs() -> list[tuple[Path, object]]:
    """Every YAML document of deploy/, with its file."""
    return [(path, doc) for path in sorted(DEPLOY.rglob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())
            if doc is not None]


def _pods() -> list[tuple[Path, str, dict, dict]]:
    """(file, namespace, pod labels, pod spec) of every Pod and workload template of deploy/ that runs dprobe
    (patches of them aside)."""
    pods = []
    for path, doc in _docs():
        if (not isinstance(doc, dict) or doc.get("kind") not in ("Pod", "Deployment", "DaemonSet", "StatefulSet")
                or path.name.endswith("-patch.yaml")):
            continue
        template = doc if doc["kind"] == "Pod" else doc["spec"]["template"]
        if any(c["image"].startswith("dprobe") for c in template["spec"]["containers"]):
            pods.append((path, doc["metadata"]["namespace"], template["metadata"]["labels"], template["spec"]))
    return pods


def _strategic_merge(base: object, patch: object) -> object:
    """``kubectl patch``'s strategic merge, as far as a Deployment patch needs it: maps merge, lists of named
    maps (containers) merge by name, anything else is replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return {**base, **{k: _strategic_merge(base.get(k), v) for k, v in patch.items()}}
    if isinstance(base, list) and isinstance(patch, list) and all(isinstance(x, dict) and "name" in x
                                                                  for x in base + patch):
        patched = {x["name"]: x for x in patch}
        return [_strategic_merge(x, patched.pop(x["name"])) if x["name"] in patched else x for x in base] + list(
            patched.values())
    return patch


TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def test_dprobe_runs_without_privileges_or_api_token() -> None:
    """Every dprobe container (the scaler, the node agent, the sidecar in a pod and as a snippet) runs as
    non-root under the runtime's seccomp profile, with a read-only root, no capabilities, no privilege
    escalation, CPU and memory limits and no Kubernetes API token (the sidecar calls no API), but the scaler's:
    its service account may only take the leader election's Lease (rbac-lease.yaml)."""
    lease_only = {("monitoring", "coordination.k8s.io", "leases")}
    account = _objects(DEPLOY / "scaler" / "rbac-lease.yaml")["ServiceAccount"]["metadata"]["name"]
    snippet = yaml.safe_load((DEPLOY / "sidecar" / "sidecar-container.yaml").read_text())
    pods = _pods()
    assert {p.name for p, _, _, _ in pods} >= {"deployment.yaml", "node-agent.yaml", "example-pod.yaml"}
    checked = []
    for path, spec, containers in [(p, spec, spec["containers"]) for p, _, _, spec in pods] + [
            (DEPLOY / "sidecar" / "sidecar-container.yaml", {}, snippet)]:
        for c in (c for c in containers if c["image"].startswith("dprobe")):
            sc, pod_sc = c.get("securityContext", {}), spec.get("securityContext", {})
            assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, (path, c["name"])
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, (path, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add"), (path, c["name"])
            assert (sc.get("seccompProfile") or pod_sc.get("seccompProfile")) == {"type": "RuntimeDefault"}, path
            assert not sc.get("privileged") and not spec.get("hostNetwork") and not spec.get("hostPID"), path
            limits = c.get("resources", {}).get("limits", {})
            assert limits.get("cpu") and limits.get("memory"), (path, c["name"])
            # no token: none mounted in the pod, or (a snippet for any pod) an empty volume over its path; the
            # scaler's, of a service account whose only grants are on the Lease
            shadowed = any(m["mountPath"] == TOKEN_PATH for m in c.get("volumeMounts", []))
            if spec.get("serviceAccountName") == account and c["args"][0] == "scaler":
                assert {g[:3] for g in _granted(DEPLOY / "scaler" / "rbac-lease.yaml")} == lease_only
                checked.append(path.name)
                continue
            assert spec.get("automountServiceAccountToken") is False or shadowed, (path, c["name"])
            checked.append(path.name)
    assert "sidecar-container.yaml" in checked and len(checked) >= 4
    # the snippet's empty volume is named for the pod's volumes
    shadow = next(m["name"] for m in snippet[0]["volumeMounts"] if m["mountPath"] == TOKEN_PATH)
    assert f"- name: {shadow}\n#   emptyDir:" in (DEPLOY / "sidecar" / "sidecar-container.yaml").read_text()


def test_apply_mode_patch_switches_the_mode_and_keeps_leader_election(tmp_path: Path) -> None:
    """The default scaler Deployment (recommend mode) runs as the service account of rbac-lease.yaml; the
    apply-mode patch turns on --mode apply and changes nothing else, leader election included (two replicas
    never both apply); rbac.yaml binds the scales to that same service account."""
    from dprobe.cli import build_parser
    from dprobe.services.scaler.config import load_config

    scaler = DEPLOY / "scaler"
    deployment = _objects(scaler / "deployment.yaml")["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    account = _objects(scaler / "rbac-lease.yaml")["ServiceAccount"]
    assert pod["serviceAccountName"] == account["metadata"]["name"] and pod["automountServiceAccountToken"] is True
    assert account["automountServiceAccountToken"] is False  # only a pod that asks for it gets the token
    assert "ServiceAccount" not in _objects(scaler / "rbac.yaml")  # one account, defined once (kustomize)
    config_file = tmp_path / "scaler.yaml"
    config_file.write_text(_objects(scaler / "configmap.yaml")["ConfigMap"]["data"]["scaler.yaml"])

    def config(pod_spec: dict):
        args = vars(build_parser().parse_args(pod_spec["containers"][0]["args"]))
        return load_config({**args, "config": str(config_file)}, env={})

    assert config(pod).mode == "recommend" and config(pod).leader_election
    patch = _objects(scaler / "apply-mode-patch.yaml")["Deployment"]
    assert (patch["metadata"]["name"], patch["metadata"]["namespace"]) == (
        deployment["metadata"]["name"], deployment["metadata"]["namespace"])
    patched = _strategic_merge(deployment, patch)
    applied = patched["spec"]["template"]["spec"]
    assert config(applied).mode == "apply" and config(applied).leader_election
    assert patched["spec"]["replicas"] == deployment["spec"]["replicas"]
    # the rest of the pod is untouched by the patch
    assert {k: v for k, v in applied["containers"][0].items() if k != "args"} == {
        k: v for k, v in pod["containers"][0].items() if k != "args"}
    assert {k: v for k, v in applied.items() if k != "containers"} == {k: v for k, v in pod.items() if k != "containers"}


def _covers(port_rule: dict, port: int) -> bool:
    return port_rule.get("protocol", "TCP") == "TCP" and port_rule.get("port", port) <= port <= port_rule.get(
        "endPort", port_rule.get("port", port))


def test_network_policies_let_only_prometheus_reach_the_metrics_ports() -> None:
    """Every dprobe pod is selected by a NetworkPolicy of its namespace that admits its metrics port from the
    monitoring namespace's Prometheus pods only (both selectors in one peer: a Prometheus pod there), and no
    rule opens that port to anyone else."""
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                  "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    policies = [doc for _, doc in _docs() if isinstance(doc, dict) and doc.get("kind") == "NetworkPolicy"]
    for path, namespace, labels, spec in _pods():
        [port] = [p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])
                  if p.get("name") == "dprobe-metrics"]
        selecting = [p for p in policies if p["metadata"]["namespace"] == namespace and "Ingress" in
                     p["spec"]["policyTypes"] and p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        assert selecting, (path, "no NetworkPolicy selects it")
        rules = [r for p in selecting for r in p["spec"].get("ingress", [])
                 if not r.get("ports") or any(_covers(pr, port) for pr in r["ports"])]
        assert rules and all(r.get("from") == [prometheus] for r in rules), (path, rules)


def test_the_scaler_reaches_only_prometheus_dns_and_the_api_server() -> None:
    """The scaler's NetworkPolicy also limits what it connects to: the monitoring namespace's Prometheus on the
    port of its prometheus_url, kube-dns on 53 (UDP and TCP), and the API server on 443 and 6443 (TCP);
    every egress rule names its ports, so nothing else is open."""
    policy = _objects(DEPLOY / "scaler" / "networkpolicy.yaml")["NetworkPolicy"]
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    config = yaml.safe_load(_objects(DEPLOY / "scaler" / "configmap.yaml")["ConfigMap"]["data"]["scaler.yaml"])
    prometheus_port = int(config["prometheus_url"].rsplit(":", 1)[1])
    allowed = set()
    for rule in policy["spec"]["egress"]:
        assert rule.get("ports"), rule  # a rule without ports would open every port
        peers = [tuple(sorted((k, tuple(sorted(v["matchLabels"].items()))) for k, v in peer.items()))
                 for peer in rule.get("to", [{}])]
        allowed |= {(peer, p.get("protocol", "TCP"), p["port"]) for peer in peers for p in rule["ports"]}
    prometheus = (("namespaceSelector", (("kubernetes.io/metadata.name", "monitoring"),)),
                  ("podSelector", (("app.kubernetes.io/name", "prometheus"),)))
    dns = (("namespaceSelector", (("kubernetes.io/metadata.name", "kube-system"),)),
           ("podSelector", (("k8s-app", "kube-dns"),)))
    assert allowed == {(prometheus, "TCP", prometheus_port), (dns, "UDP", 53), (dns, "TCP", 53),
                       ((), "TCP", 443), ((), "TCP", 6443)}


KUBE_DNS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}


def _egress_ports(rule: dict) -> set[tuple[str, int]]:
    return {(p.get("protocol", "TCP"), p["port"]) for p in rule["ports"]}


def test_network_policies_let_the_sidecar_reach_its_source_and_dns_only() -> None:
    """Every pod running the sidecar (the node agent, the example workload pod) is selected by a policy with
    egress rules: to dcgm-exporter's port (the one its DCGM URL names), DNS to kube-dns only, nothing on other
    ports but what the example's server needs (443); no egress rule opens every port."""
    policies = [doc for _, doc in _docs() if isinstance(doc, dict) and doc.get("kind") == "NetworkPolicy"]
    sidecars = [(path, ns, labels, spec) for path, ns, labels, spec in _pods()
                if any(c.get("args", [""])[0] == "sidecar" for c in spec["containers"])]
    assert {path.name for path, *_ in sidecars} == {"node-agent.yaml", "example-pod.yaml"}
    for path, namespace, labels, spec in sidecars:
        [dcgm_url] = [e["value"] for c in spec["containers"] for e in c.get("env", [])
                      if e["name"] == "DPROBE_SIDECAR_DCGM_URL"]
        dcgm_port = int(re.search(r":(\d+)/metrics$", dcgm_url).group(1))
        selecting = [p for p in policies if p["metadata"]["namespace"] == namespace
                     and p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        assert selecting and all("Egress" in p["spec"]["policyTypes"] for p in selecting), path
        rules = [r for p in selecting for r in p["spec"].get("egress", [])]
        assert rules and all(r.get("ports") for r in rules), (path, rules)  # never every port
        allowed = set().union(*(_egress_ports(r) for r in rules))
        server = {("TCP", 443)} if path.name == "example-pod.yaml" else set()
        assert allowed == {("TCP", dcgm_port), ("UDP", 53), ("TCP", 53)} | server, (path, allowed)
        dns = [r for r in rules if _egress_ports(r) & {("UDP", 53), ("TCP", 53)}]
        assert dns and all(r.get("to") == [KUBE_DNS] and _egress_ports(r) == {("UDP", 53), ("TCP", 53)}
                           for r in dns), (path, dns)


def test_pod_monitors_keep_the_series_own_labels() -> None:
    """Both PodMonitors honour the series' labels: the sidecar's name the forecast pods, the scaler's the
    workload's namespace (which the KEDA example's query selects); the Operator's would replace them."""
    monitors = {path.parent.name: doc for path, doc in _docs() if isinstance(doc, dict) and doc.get("kind") == "PodMonitor"}
    assert set(monitors) == {"scaler", "sidecar"}
    for monitor in monitors.values():
        assert all(e.get("honorLabels") is True for e in monitor["spec"]["podMetricsEndpoints"])


SCHEMAS = Path(__file__).resolve().parent / "schemas"
# what KEDA's Prometheus scaler reads from a trigger's metadata (pkg/scalers/prometheus_scaler.go, authModes
# from its authentication config); anything else there is ignored without a word
KEDA_PROMETHEUS_METADATA = {"serverAddress", "query", "queryParameters", "threshold", "activationThreshold",
                            "namespace", "customHeaders", "ignoreNullValues", "unsafeSsl", "awsRegion", "timeout",
                            "identityOwner", "authModes"}


def _schema_errors(value: object, schema: dict, where: str = "") -> list[str]:
    """Where ``value`` breaks an OpenAPI v3 schema of a CRD, with unknown fields as errors (as the API server's
    strict field validation, kubectl apply --validate=strict, reports them)."""
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        return [] if isinstance(value, int | str) and not isinstance(value, bool) else [f"{where}: not int or string"]
    expected = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int, "number": int | float}
    if kind in expected and (not isinstance(value, expected[kind]) or (kind in ("integer", "number")
                                                                     and isinstance(value, bool))):
        return [f"{where}: {value!r} is not {kind}"]
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not one of {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{where}: {value} < {schema['minimum']}")
    if isinstance(value, dict) and not schema.get("x-kubernetes-preserve-unknown-fields"):
        props = schema.get("properties")
        errors += [f"{where}.{k}: required" for k in schema.get("required", []) if k not in value]
        for key, item in value.items():
            if props is not None and key in props:
                errors += _schema_errors(item, props[key], f"{where}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += _schema_errors(item, schema["additionalProperties"], f"{where}.{key}")
            elif props is not None:
                errors.append(f"{where}.{key}: unknown field")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{where}: fewer than {schema['minItems']} items")
        for i, item in enumerate(value):
            errors += _schema_errors(item, schema.get("items", {}), f"{where}[{i}]")
    return errors


def test_keda_scaled_objects_put_every_field_where_keda_reads_it() -> None:
    """Both ScaledObjects validate against KEDA's own CRD schema (tests/schemas, unknown fields refused);
    metricType is the trigger's (KEDA ignores it in metadata, and its fallback needs AverageValue); an
    empty answer is an error to KEDA (ignoreNullValues "false"), so its fallback, max(current, replicas),
    holds instead of reading 0."""
    crd = yaml.safe_load((SCHEMAS / "keda.sh_scaledobjects.yaml").read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = version["schema"]["openAPIV3Schema"]
    objects = [doc for _, doc in _docs() if isinstance(doc, dict) and doc.get("kind") == "ScaledObject"]
    assert len(objects) == 2
    for obj in objects:
        assert obj["apiVersion"] == f"{crd['spec']['group']}/v1alpha1"
        assert _schema_errors(obj, schema) == [], obj["metadata"]["name"]
        assert obj["spec"]["fallback"]["behavior"] == "currentReplicasIfHigher"
        for trigger in obj["spec"]["triggers"]:
            assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
            assert set(trigger["metadata"]) <= KEDA_PROMETHEUS_METADATA, set(trigger["metadata"])
            assert trigger["metadata"]["ignoreNullValues"] == "false"
    # the check itself: a field KEDA does not have, or a value of the wrong type, is refused
    obj = objects[0]
    assert _schema_errors({**obj, "spec": {**obj["spec"], "metricType": "AverageValue"}}, schema) == [
        ".spec.metricType: unknown field"]
    fallback = {**obj["spec"]["fallback"], "failureThreshold": "3"}
    assert _schema_errors({**obj, "spec": {**obj["spec"], "fallback": fallback}}, schema) == [
        ".spec.fallback.failureThreshold: '3' is not integer"]


def test_dockerfile_base_image_is_pinned_by_digest() -> None:
    """Every image the Dockerfile builds from is pinned by its sha256 digest (its own stages aside): a
    rebuild gets the same base, not whatever the tag points to that day."""
    text = (DEPLOY / "Dockerfile").read_text()
    froms = re.findall(r"^FROM (\S+)(?: AS (\w+))?$", text, re.M)
    stages: set[str] = set()
    external = []
    for image, stage in froms:
        if image not in stages:
            external.append(image)
        stages.add(stage)
    assert external and all(re.fullmatch(r"[\w./:-]+@sha256:[0-9a-f]{64}", image) for image in external), external
