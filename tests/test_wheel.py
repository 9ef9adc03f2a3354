"""What the wheel carries (pyproject.toml's package data) and, built and installed in a venv of its own, that it
works as the README says from a directory with no checkout (tools/wheel_smoke.py, which .ci/run also runs against
the registry)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_every_package_data_pattern_matches_files_and_names_the_sample_and_py_typed() -> None:
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["dprobe"]
    empty = [p for p in patterns if not [f for f in (REPO / "dprobe").glob(p) if f.is_file()]]
    assert not empty, f"package data matching no file: {empty}"
    assert "py.typed" in patterns and (REPO / "dprobe" / "py.typed").is_file()
    sample = {f.name for p in patterns for f in (REPO / "dprobe").glob(p) if "samples" in f.parts}
    assert {"LICENSE", "NOTICE.md", "pod_gpu_duty_cycle_anon.csv.gz", "pod_gpu_memory_used_bytes_anon.csv.gz"} <= sample
    manifest = (REPO / "MANIFEST.in").read_text()
    assert "dprobe/data/samples" in manifest and "dprobe/py.typed" in manifest


@pytest.mark.slow
def test_the_wheel_installed_elsewhere_serves_forecasts_and_refuses_training_without_data(tmp_path: Path) -> None:
    """Offline (this venv's setuptools, and its packages as the dependencies): the wheel holds the configs, the
    model and the replay sample; dprobe --help, the sidecar's forecasts on /metrics, dprobe train's one line."""
    r = subprocess.run([sys.executable, str(REPO / "tools" / "wheel_smoke.py"), "--offline", "--keep",
                        str(tmp_path / "work")], capture_output=True, text=True, timeout=540)
    assert r.returncode == 0, r.stdout + r.stderr
    for check in ("builds the wheel", "serves forecasts on /metrics", "the sample in the package",
                  "dprobe train without data: one line"):
        assert check in r.stdout, r.stdout
