"""The services without the full install: ``pip install dprobe`` (the base requirements) and the Dockerfile's
``services`` target install dprobe without torch and the training stack (the train extra); the base install also
leaves out the scaler's Kubernetes client (the scaler extra). These tests run the
real ``dprobe sidecar`` and ``dprobe scaler`` in processes where those packages cannot be imported (as if not
installed), check that they serve what they should, and that every distribution they load is one the base
requirements bring; and that pyproject.toml's lists and requirements.lock (the exact versions CI installs)
agree with each other and with :data:`dprobe.core.lazy.FULL_INSTALL`."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from dprobe.core.lazy import FULL_INSTALL, SCALER_INSTALL, missing_package

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = REPO / "pyproject.toml"
LOCK = REPO / "requirements.lock"
BASE = "dprobe's base requirements"

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


def _command(*args: str, absent: Iterable[str] = FULL_INSTALL) -> list[str]:
    return [sys.executable, "-c", WITHOUT_FULL_INSTALL, json.dumps(sorted(absent)), *args]


def _base(texts: list[str]) -> list[Requirement]:
    """The requirements among ``texts`` that hold without an extra (markers evaluated for no extra)."""
    reqs = [Requirement(text) for text in texts]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def _listed() -> set[str]:
    """The installed dprobe's base requirements (what ``pip install dprobe`` brings, no extra) and everything
    they depend on (their own requirements)."""
    names = [r.name for r in _base(requires("dprobe") or [])]
    assert names, "the installed dprobe has no base requirements"
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
    assert not unlisted, f"loaded but not in {BASE} (pyproject.toml's dependencies): {sorted(unlisted)}"


@pytest.mark.slow
def test_the_sidecar_replays_the_h200_trace_without_torch(free_port) -> None:
    port = free_port()
    _, loaded = _serve(["sidecar", "--source", "replay", "--replay-dataset", "h200", "--step-seconds", "1",
                        "--min-points", "3", "--forecast-interval", "1"], port,
                       re.compile(r"^dprobe_observed_gpu_memory_bytes\{.*\} \d", re.M))
    unlisted = {canonicalize_name(d) for d in loaded} - _listed() - {"dprobe"}
    assert not unlisted, f"loaded but not in {BASE} (pyproject.toml's dependencies): {sorted(unlisted)}"


@pytest.mark.slow
def test_the_scaler_runs_without_torch(free_port) -> None:
    port = free_port()  # no Prometheus there: the scaler runs its cycles and counts the failed queries
    text, loaded = _serve(["scaler", "--prometheus-url", f"http://127.0.0.1:{free_port()}", "--interval", "1"],
                          port, re.compile(r'^dprobe_scaler_errors_total\{stage="query"\} [1-9]', re.M))
    assert "dprobe_scaler_cycle_seconds_count" in text
    unlisted = {canonicalize_name(d) for d in loaded} - _listed() - {"dprobe"}
    assert not unlisted, f"loaded but not in {BASE} (pyproject.toml's dependencies): {sorted(unlisted)}"


@pytest.mark.parametrize("args, says", [
    (["--job", "torchvision:resnet18 batch=8"], "job profiles .* torch, which is not installed"),
    (["--checkpoint", "outputs/dprobe.pt"], "needs the Python package torch, which is not installed"),
])
@pytest.mark.slow
def test_what_needs_the_full_install_is_refused_clearly(args: list[str], says: str) -> None:
    r = subprocess.run(_command("sidecar", "--source", "synthetic", *args), cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert re.search(f"dprobe sidecar: error: .*{says}", r.stderr), r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args, needs", [
    (["--leader-election"], "--leader-election"),
    (["--mode", "apply"], "--mode apply"),
])
@pytest.mark.slow
def test_the_scaler_without_the_kubernetes_client_says_which_extra_in_one_line(args: list[str], needs: str,
                                                                               free_port) -> None:
    """The base install leaves the kubernetes client out: what needs it is refused at the start, in one line
    naming the scaler extra; the scaler reading Prometheus only runs without it (above)."""
    r = subprocess.run(_command("scaler", "--prometheus-url", f"http://127.0.0.1:{free_port()}", *args,
                                absent=[*FULL_INSTALL, *SCALER_INSTALL]),
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith(f"dprobe scaler: error: {needs} needs the Kubernetes client"), \
        r.stderr
    assert "pip install 'dprobe[scaler]'" in errors[0] and "Traceback" not in r.stderr


def test_a_missing_kubernetes_client_is_told_as_the_scaler_extra() -> None:
    """Wherever else the scaler imports the client (dprobe.services.scaler.kube, .leader), dprobe's one-line
    error names the scaler extra."""
    message = missing_package(ModuleNotFoundError("No module named 'kubernetes.client'", name="kubernetes.client"))
    assert message is not None and "pip install 'dprobe[scaler]'" in message
    assert missing_package(ModuleNotFoundError("No module named 'nothing_of_ours'", name="nothing_of_ours")) is None


# -- pyproject.toml's lists and requirements.lock ------------------------------------------------------------


def _project() -> dict[str, list[Requirement]]:
    """pyproject.toml's requirements: ``""`` for the base, then one entry per extra."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    return {"": [Requirement(r) for r in project["dependencies"]],
            **{extra: [Requirement(r) for r in reqs] for extra, reqs in project["optional-dependencies"].items()}}


def _pins(text: str) -> dict[str, Version]:
    """A lock's exact pins: canonical name -> version; anything but ``name==version`` fails."""
    pins = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and name.strip() and " " not in name.strip(), f"not an exact pin: {line!r}"
            pins[canonicalize_name(name.strip())] = Version(version.strip())
    return pins


def _unpinned(groups: dict[str, list[Requirement]], pins: dict[str, Version]) -> list[str]:
    """The requirements (base and every extra, self-references aside) that ``pins`` leaves out or breaks."""
    bad = []
    for extra, reqs in groups.items():
        for req in (r for r in reqs if canonicalize_name(r.name) != "dprobe"):
            pin = pins.get(canonicalize_name(req.name))
            if pin is None or not req.specifier.contains(pin, prereleases=True):
                bad.append(f"{req} ({extra or 'base'}): {pin or 'not in the lock'}")
    return bad


def _full(reqs: list[Requirement]) -> set[str]:
    return {canonicalize_name(r.name) for r in reqs} & {canonicalize_name(d) for d in FULL_INSTALL.values()}


def test_the_lock_pins_every_requirement_within_its_range() -> None:
    """requirements.lock (pip's constraints file for every install: tools/lock.py writes it) pins each
    requirement of pyproject.toml, the base and every extra's, to one version its specifier allows."""
    groups, pins = _project(), _pins(LOCK.read_text())
    assert {"", "train", "test"} <= set(groups)
    assert "dprobe" not in pins, "requirements.lock pins dprobe itself"
    assert not _unpinned(groups, pins), "\n".join(_unpinned(groups, pins))
    # the check itself: a pin outside a range, a missing pin, a line that is not a pin
    assert _unpinned({"": [Requirement("numpy>=1.26,<3")]}, {"numpy": Version("3.0")})
    assert _unpinned({"train": [Requirement("torch==2.14.1")]}, {})
    with pytest.raises(AssertionError, match="not an exact pin"):
        _pins("numpy>=1.26\n")


def test_the_base_requirements_leave_the_training_stack_out() -> None:
    """``pip install dprobe`` is the services: no package of the full install (FULL_INSTALL) among the base
    requirements, in pyproject.toml nor in the installed dprobe's metadata."""
    groups = _project()
    assert not _full(groups[""]), f"pyproject.toml's dependencies bring {sorted(_full(groups['']))}"
    assert not _full(_base(requires("dprobe") or [])), "the installed dprobe's base requirements bring the " \
        "training stack: reinstall it (pip install -c requirements.lock -e '.[test]')"
    assert "onnxruntime" in {canonicalize_name(r.name) for r in groups[""]}  # the sidecar's ONNX forecasts
    assert _full([Requirement("torch==2.14.1")]) == {"torch"}  # the check itself


def test_the_scaler_extra_brings_the_kubernetes_client_and_the_base_leaves_it_out() -> None:
    """``pip install dprobe`` (the sidecar, the scaler reading Prometheus) without the kubernetes client, 126 MB
    of its own; ``pip install 'dprobe[scaler]'`` brings it (SCALER_INSTALL), and the test extra pulls it in."""
    groups = _project()
    scaler = {canonicalize_name(d) for d in SCALER_INSTALL.values()}
    assert not scaler & {canonicalize_name(r.name) for r in groups[""]}, "the base requirements bring kubernetes"
    assert scaler <= {canonicalize_name(r.name) for r in groups["scaler"]}
    assert "dprobe[scaler]" in {str(r) for r in groups["test"]}


def test_the_train_extra_brings_the_full_install() -> None:
    """Every distribution that FULL_INSTALL names (what a command refuses without, dprobe.core.lazy) is a
    requirement of the train extra, which the test extra pulls in."""
    groups = _project()
    needed = {canonicalize_name(d) for d in FULL_INSTALL.values()}
    assert not needed - _full(groups["train"]), f"not in the train extra: {sorted(needed - _full(groups['train']))}"
    assert "dprobe[train]" in {str(r) for r in groups["test"]}
    # ranges, so that dprobe installs beside a user's own torch; the lock pins CI's (its torch is on disk)
    specs = {canonicalize_name(r.name): r.specifier for r in groups["train"]}
    for name in ("torch", "torchvision", "torch-geometric"):
        assert not any(s.operator == "==" for s in specs[name]), f"{name} pinned exactly in the train extra"
    pins = _pins(LOCK.read_text())
    assert str(pins["torch"]) == "2.14.1" and str(pins["torchvision"]) == "0.29.1"
    assert _full([Requirement("numpy")]) == set()  # the check itself
