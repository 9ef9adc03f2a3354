"""The services without the full install: deploy/requirements-services.txt and the Dockerfile's ``services``
target install dprobe without torch and the training stack. These tests run the real ``dprobe sidecar`` and
``dprobe scaler`` in processes where those packages cannot be imported (as if not installed), check that they
serve what they should, and that every distribution they load is one the requirements file brings."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from importlib.metadata import PackageNotFoundError, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from dprobe.core.lazy import FULL_INSTALL

REPO = Path(__file__).resolve().parent.parent
REQUIREMENTS = REPO / "deploy" / "requirements-services.txt"

# runs dprobe's CLI with the full install's packages absent; on exit, prints the distributions it loaded
WITHOUT_FULL_INSTALL = r"""
import atexit, importlib.abc, json, sys

ABSENT = set(json.loads(sys.argv[1]))


class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Absent())
BEFORE = set(sys.modules)  # what the interpreter itself loaded (site, .pth hooks)


def report():
    from importlib.metadata import packages_distributions

    dists = packages_distributions()
    loaded = sorted({d for m in set(sys.modules) - BEFORE for d in dists.get(m.split(".")[0], [])})
    print("DISTRIBUTIONS " + json.dumps(loaded), flush=True)


atexit.register(report)
from dprobe.cli import main

sys.exit(main(sys.argv[2:]))
"""


def _command(*args: str) -> list[str]:
    return [sys.executable, "-c", WITHOUT_FULL_INSTALL, json.dumps(sorted(FULL_INSTALL)), *args]


def _listed() -> set[str]:
    """The requirements file's distributions and everything they depend on (their own requirements)."""
    names = [Requirement(line).name for line in REQUIREMENTS.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    seen: set[str] = set()
    while names:
        name = canonicalize_name(names.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            deps = requires(name) or []
        except PackageNotFoundError:
            continue
        for text in deps:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                names.append(req.name)
    return seen


def _serve(args: list[str], port: int, until: re.Pattern[str], timeout: float = 90) -> tuple[str, list[str]]:
    """Run a service until its /metrics matches ``until``; SIGTERM it; (/metrics, distributions loaded)."""
    proc = subprocess.Popen(_command(*args, "--listen-address", "127.0.0.1", "--port", str(port)), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text = ""
    try:
        deadline = time.time() + timeout
        while not until.search(text):
            assert proc.poll() is None, f"the service stopped: {proc.stdout.read()}"
            assert time.time() < deadline, f"/metrics never matched {until.pattern}"
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                pass
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    line = next(ln for ln in out.splitlines() if ln.startswith("DISTRIBUTIONS "))
    return text, json.loads(line.split(" ", 1)[1])


@pytest.mark.slow
def test_the_sidecar_forecasts_with_the_shipped_model_without_torch(free_port) -> None:
    port = free_port()
    text, loaded = _serve(["sidecar", "--source", "replay", "--forecast-interval", "1"], port,
                          re.compile(r'^dprobe_predicted_gpu_memory_bytes\{.*quantile="0.9".*\} \d', re.M))
    assert re.search(r'dprobe_model_info\{checkpoint="[^"]*default_forecaster\.onnx",kind="dprobe-forecaster '
                     r'\(onnx\)"', text)
    assert "torch" not in loaded and "torch" in FULL_INSTALL
    unlisted = {canonicalize_name(d) for d in loaded} - _listed() - {"dprobe"}
    assert not unlisted, f"loaded but not in {REQUIREMENTS.name}: {sorted(unlisted)}"


@pytest.mark.slow
def test_the_sidecar_replays_the_h200_trace_without_torch(free_port) -> None:
    port = free_port()
    _, loaded = _serve(["sidecar", "--source", "replay", "--replay-dataset", "h200", "--step-seconds", "1",
                        "--min-points", "3", "--forecast-interval", "1"], port,
                       re.compile(r"^dprobe_observed_gpu_memory_bytes\{.*\} \d", re.M))
    unlisted = {canonicalize_name(d) for d in loaded} - _listed() - {"dprobe"}
    assert not unlisted, f"loaded but not in {REQUIREMENTS.name}: {sorted(unlisted)}"


def test_the_scaler_runs_without_torch(free_port) -> None:
    port = free_port()  # no Prometheus there: the scaler runs its cycles and counts the failed queries
    text, loaded = _serve(["scaler", "--prometheus-url", f"http://127.0.0.1:{free_port()}", "--interval", "1"],
                          port, re.compile(r'^dprobe_scaler_errors_total\{stage="query"\} [1-9]', re.M))
    assert "dprobe_scaler_cycle_seconds_count" in text
    unlisted = {canonicalize_name(d) for d in loaded} - _listed() - {"dprobe"}
    assert not unlisted, f"loaded but not in {REQUIREMENTS.name}: {sorted(unlisted)}"


@pytest.mark.parametrize("args, says", [
    (["--job", "torchvision:resnet18 batch=8"], "job profiles .* torch, which is not installed"),
    (["--checkpoint", "outputs/dprobe.pt"], "needs the Python package torch, which is not installed"),
])
def test_what_needs_the_full_install_is_refused_clearly(args: list[str], says: str) -> None:
    r = subprocess.run(_command("sidecar", "--source", "synthetic", *args), cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert re.search(f"dprobe sidecar: error: .*{says}", r.stderr), r.stderr
    assert "Traceback" not in r.stderr
