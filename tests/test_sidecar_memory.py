"""The memory of the sidecar's child processes: the container's limit read from its cgroup, and a child (a job's
prediction, a model graph's build) killed once its resident memory passes what that limit leaves it beside the
sidecar, or job_rss_limit_mib; the sidecar goes on, its targets forecast as unknown workloads.

    python tests/test_sidecar_memory.py    # the figures of docs/sidecar.md: the sidecar alone, its children
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from dprobe.services.sidecar.annotations import MODEL_GRAPH
from dprobe.services.sidecar.child import ChildFailed, ChildRunner, JobLimits
from dprobe.services.sidecar.graphs import GraphRequest
from dprobe.services.sidecar.jobs import JobSpec
from dprobe.services.sidecar.memory import MARGIN_BYTES, MIB, MemoryLimit, cgroup_memory_limit, rss_bytes

REPO = Path(__file__).resolve().parents[1]
RESNET18 = {"request": asdict(GraphRequest.of("torchvision:resnet18 batch=2")), "max_bytes": 2**24}  # as annotated


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize("proc,files,limit", [
    # cgroup v2 in a cgroup namespace (containerd, CRI-O): the container's cgroup is the root
    ("0::/\n", {"memory.max": "536870912\n"}, 512 * MIB),
    # cgroup v2 seen whole: the lowest of the container's, the pod's and the QoS class's
    ("0::/kubepods.slice/pod-1.slice/cri-1.scope\n", {"kubepods.slice/memory.max": "max\n",
                                                     "kubepods.slice/pod-1.slice/memory.max": "1073741824\n",
                                                     "kubepods.slice/pod-1.slice/cri-1.scope/memory.max": "805306368\n"},
     768 * MIB),
    ("0::/\n", {"memory.max": "max\n"}, None),  # no limit
    # cgroup v1: the memory hierarchy; "no limit" is a number near 2**63
    ("5:cpu,cpuacct:/kubepods/pod-1/c1\n4:memory:/kubepods/pod-1/c1\n",
     {"memory/memory.limit_in_bytes": "9223372036854771712\n",
      "memory/kubepods/pod-1/memory.limit_in_bytes": "1610612736\n",
      "memory/kubepods/pod-1/c1/memory.limit_in_bytes": "1073741824\n"}, 1024 * MIB),
    ("4:memory:/docker/abc\n", {"memory/memory.limit_in_bytes": "268435456\n"}, 256 * MIB),  # namespaced v1
    ("4:memory:/\n", {"memory/memory.limit_in_bytes": "9223372036854771712\n"}, None),
    ("0::/\n", {}, None),  # no memory controller
])
def test_the_memory_limit_is_read_from_the_cgroup(tmp_path: Path, proc: str, files: dict[str, str],
                                                  limit: int | None) -> None:
    """cgroup v2 memory.max or v1 memory.limit_in_bytes, the lowest from the process's cgroup up, whether the
    hierarchy is seen whole or from a cgroup namespace; None without a limit."""
    _tree(tmp_path / "fs", files)
    (tmp_path / "cgroup").write_text(proc)
    assert cgroup_memory_limit(tmp_path / "cgroup", tmp_path / "fs") == limit
    assert cgroup_memory_limit(tmp_path / "missing", tmp_path / "fs") is None


def test_the_memory_limit_and_the_childs_budget() -> None:
    """memory_limit_mib wins over the cgroup; the child's budget is the limit less the sidecar's RSS and the
    margin; this process's RSS is what /proc says."""
    assert MemoryLimit.find(512).bytes == 512 * MIB and "memory_limit_mib" in str(MemoryLimit.find(512))
    assert MemoryLimit.find().bytes == cgroup_memory_limit()
    assert MemoryLimit(512 * MIB, "x").child_budget(200 * MIB) == 512 * MIB - 200 * MIB - MARGIN_BYTES
    assert MemoryLimit(None, "none").child_budget(200 * MIB) is None
    own = rss_bytes()
    assert own is not None and 10 * MIB < own < 64 * 2**30
    assert rss_bytes(2**22 + 12345) is None  # no such process
    with pytest.raises(ValueError, match="job_rss_limit_mib must be positive, or 0"):
        JobLimits(rss_mib=-1)


@pytest.mark.slow
def test_a_child_past_its_resident_budget_is_killed() -> None:
    """Tracing ResNet-18 (a child of about 700 MiB resident, within its 8 GiB of address space) is killed once
    its RSS passes its budget: job_rss_limit_mib, or what the memory limit leaves beside this process; with
    room, it is built and its peak is known."""
    for runner, why in [(ChildRunner(JobLimits(rss_mib=200)), "job_rss_limit_mib"),
                        (ChildRunner(JobLimits(), MemoryLimit(rss_bytes() + MARGIN_BYTES + 200 * MIB, "a test limit")),
                         "a test limit")]:
        started = time.monotonic()
        with pytest.raises(ChildFailed, match=f"MiB resident, over its budget of ([0-9]+) MiB \\({why}") as failed:
            runner.run("graph", RESNET18)
        assert failed.value.reason == "memory" and time.monotonic() - started < 60
        budget = int(str(failed.value).split("budget of ")[1].split()[0])
        assert 180 <= budget <= 220, str(failed.value)
        assert 200 * MIB < runner.peak_rss_bytes < 400 * MIB, runner.peak_rss_bytes  # killed on its way up
    runner = ChildRunner(JobLimits(), MemoryLimit(rss_bytes() + MARGIN_BYTES + 4 * 2**30, "room"))
    assert runner.run("graph", RESNET18)["num_nodes"] > 50
    assert 300 * MIB < runner.peak_rss_bytes < 4 * 2**30, runner.peak_rss_bytes


LIMITED_SIDECAR = """
import json, sys, time, urllib.request
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from dprobe.core.names import QUANTILES
from dprobe.forecaster.base import Forecast
from dprobe.forecaster.loading import LoadedModel
from dprobe.services.sidecar.config import load_config
from dprobe.services.sidecar.service import Sidecar
from dprobe.services.sources import Sample


def status(key):
    return int(next(line for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith(key + ":")).split()[1]) * 1024


class Reader:
    name, conditioned = "graph-reader", True

    def __init__(self):
        self.graphs = []

    def predict(self, batch):
        self.graphs.extend(batch.graphs or [])
        last = np.array([row[~np.isnan(row)][-1] for row in batch.values])
        q = last[:, None, None] * np.ones((1, len(batch.leads), len(QUANTILES)))
        return Forecast(point=q[..., 0], quantiles=q, leads=batch.leads)


class Pods:
    name = "pods"

    def poll(self):
        return [Sample("ml/a", time.time(), 1e9, 0.5, {"namespace": "ml", "pod": "a"})]

    def close(self):
        pass


annotations, = sys.argv[1:]
# the environment (DPROBE_SIDECAR_MEMORY_LIMIT_MIB) as in a pod
config = load_config({"listen_address": "127.0.0.1", "port": 0, "sample_interval": 0.05, "forecast_interval": 0.2,
                      "step_seconds": 0.1, "window_seconds": 5.0, "horizons": [1], "stale_after": 2.0,
                      "max_backoff": 0.2, "annotations_file": annotations})
reader = Reader()
sc = Sidecar(config, sources=[Pods()], model=LoadedModel(reader, "graph-reader", "test", ""))
sc.start()
deadline = time.time() + 300
while time.time() < deadline and not (sc.graphs.errors_total or sc.graphs.graph("ml/a")):
    time.sleep(0.1)
child_peak = getattr(sc.children, "peak_rss_bytes", 0)
cycles, seen = sc.engine.cycles_total, len(reader.graphs)
time.sleep(1.5)
with urllib.request.urlopen(sc.server.url + "/metrics", timeout=10) as r:
    page = r.read().decode()
samples = [s for fam in text_string_to_metric_families(page) for s in fam.samples]
print(json.dumps({
    "errors": {s.labels["reason"]: s.value for s in samples if s.name == "dprobe_graph_errors_total"},
    "forecast": any(s.name == "dprobe_predicted_gpu_memory_bytes" and s.labels["target"] == "ml/a" for s in samples),
    "cycles_after": sc.engine.cycles_total - cycles, "graphs_after": reader.graphs[seen:][-3:] == [None] * 3,
    "graph": sc.graphs.graph("ml/a") is not None, "child_peak_mib": child_peak / 2**20,
    "sidecar_rss_mib": status("VmRSS") / 2**20, "sidecar_peak_mib": status("VmHWM") / 2**20,
    "torch": "torch" in sys.modules}))
sc.stop()
"""


@pytest.mark.slow
def test_a_graph_past_the_memory_limit_is_killed_and_the_sidecar_goes_on(annotate, tmp_path: Path) -> None:
    """Under a 512 MiB memory limit (DPROBE_SIDECAR_MEMORY_LIMIT_MIB; in a pod the cgroup's), a pod annotated
    torchvision:resnet18 had its graph traced by a child of about 700 MiB beside the sidecar, the two over the
    limit (the kernel's OOM killer's to settle): the child is killed at what the limit leaves it, the sidecar
    and the child stay under the limit together, the failure is counted (reason memory), and the target is
    forecast on as an unknown workload."""
    ann = tmp_path / "annotations"
    annotate(ann, **{MODEL_GRAPH: "torchvision:resnet18 batch=2"})
    script = tmp_path / "limited_sidecar.py"
    script.write_text(textwrap.dedent(LIMITED_SIDECAR))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPROBE_SIDECAR_")}
    run = subprocess.run([sys.executable, str(script), str(ann)], cwd=REPO, capture_output=True, text=True,
                         timeout=500, env={**env, "PYTHONPATH": str(REPO), "DPROBE_SIDECAR_MEMORY_LIMIT_MIB": "512"})
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["errors"]["memory"] == 1 and sum(got["errors"].values()) == 1 and not got["graph"], got
    assert "over its budget" in run.stderr and "less the sidecar's" in run.stderr, run.stderr[-2000:]
    assert got["forecast"] and got["cycles_after"] >= 3 and got["graphs_after"], got  # an unknown workload
    assert got["sidecar_peak_mib"] + got["child_peak_mib"] < 512, got
    assert not got["torch"], got



def _measure() -> None:
    """The figures of docs/sidecar.md: the sidecar alone, and the peak RSS of its children, each twice."""
    from test_sidecar_targets import run_apart  # tests/ is this script's directory

    print(json.dumps({"sidecar alone (8 targets, 30 s)": run_apart(8, 30.0)}))
    runner = ChildRunner(JobLimits(timeout_s=600, cpu_s=600))
    for task, args in [("graph", RESNET18),
                       ("graph", {"request": asdict(GraphRequest.of("transformers:BertConfig/BertForMaskedLM batch=32")),
                                  "max_bytes": 2**24}),
                       ("graph", {"request": asdict(GraphRequest.of("transformers:GPT2Config/GPT2LMHeadModel batch=2 "
                                                                    "seq=128")), "max_bytes": 2**24}),
                       ("job", {"spec": asdict(JobSpec.parse("torchvision:resnet50 batch=64 precision=bf16")),
                                "checkpoint": None})]:
        for _ in range(2):
            started = time.monotonic()
            runner.run(task, args)
            of = str(GraphRequest(**args["request"])) if task == "graph" else args["spec"]["model"]
            print(json.dumps({"task": task, "of": of,
                              "seconds": round(time.monotonic() - started, 1),
                              "peak_rss_mib": round(runner.peak_rss_bytes / MIB)}))


if __name__ == "__main__":
    _measure()
