"""Build dprobe's wheel, install it in a fresh virtualenv (the base install, `pip install dprobe`) and use it as a
new user would, from a directory with no checkout: ``dprobe --help``; ``dprobe sidecar`` on a loopback port until
/metrics serves a forecast (no GPU here: it replays the sample that ships in the wheel); ``dprobe train``, which has
no data there and must say so in one line; ``dprobe scaler --leader-election``, which must name the scaler extra.

    .venv/bin/python tools/wheel_smoke.py                 # what .ci/run runs: the registry for the dependencies
    .venv/bin/python tools/wheel_smoke.py --offline       # no registry: the running venv's setuptools builds, and
                                                          # its site-packages serve the dependencies
    .venv/bin/python tools/wheel_smoke.py --keep DIR      # keep the wheel and the venv in DIR

Prints the wheel's size, the install's time and size, and one line per check; exits 1 at the first that fails.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# what a build reads (pyproject.toml's package data, setup.py's conf/): copied, so the checkout gets no build/
BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "conf", "dprobe")
# files the wheel must hold for the checks below and for users
IN_WHEEL = ("dprobe/py.typed", "dprobe/default_forecaster.onnx", "dprobe/conf/train.yaml",
            "dprobe/data/samples/alibaba-genai-2026/LICENSE", "dprobe/data/samples/alibaba-genai-2026/NOTICE.md",
            "dprobe/data/samples/alibaba-genai-2026/pod_gpu_duty_cycle_anon.csv.gz",
            "dprobe/data/samples/alibaba-genai-2026/pod_gpu_memory_used_bytes_anon.csv.gz")
FORECAST = re.compile(r'^dprobe_predicted_gpu_memory_bytes\{[^}]*quantile="0\.9"[^}]*\} [0-9.e+]+$', re.M)


class SmokeError(Exception):
    """A check failed: what was expected and what came."""


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]


def check(ok: bool, what: str, detail: str = "") -> None:
    if not ok:
        raise SmokeError(f"{what}\n{detail}".rstrip())
    print(f"ok: {what}", flush=True)


def mib(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    return sum(p.stat().st_size for p in files) / 2**20


def build_wheel(work: Path, offline: bool) -> Path:
    """dprobe's wheel, built with pip (``--no-build-isolation`` offline: this venv's setuptools) from a copy of
    the build's inputs."""
    src = work / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        path = REPO / name
        if not path.exists():
            continue
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work / "dist"), str(src)]
    r = run(cmd + (["--no-build-isolation"] if offline else []))
    check(r.returncode == 0, "pip wheel --no-deps builds the wheel", r.stdout + r.stderr)
    wheel = next((work / "dist").glob("dprobe-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [n for n in IN_WHEEL if n not in names]
    check(not missing, f"the wheel holds py.typed, the configs, the model and the replay sample ({wheel.name}, "
                       f"{mib(wheel):.1f} MiB)", f"missing: {missing}")
    return wheel


def install(work: Path, wheel: Path, offline: bool) -> Path:
    """A fresh venv with the wheel: its base requirements at requirements.lock's versions from the registry, or
    offline this venv's site-packages in reach (a .pth line) and the wheel alone installed."""
    venv = work / "venv"
    r = run([sys.executable, "-m", "venv", str(venv)])
    check(r.returncode == 0, "a fresh venv", r.stderr)
    python = venv / "bin" / "python"
    start = time.perf_counter()
    if offline:
        purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
        Path(purelib, "dprobe-smoke-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
        cmd = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)]
    else:
        cmd = [str(python), "-m", "pip", "install", "-q", "-c", str(REPO / "requirements.lock"), str(wheel)]
    r = run(cmd)
    seconds = time.perf_counter() - start
    check(r.returncode == 0, f"pip install {'--no-deps ' if offline else '-c requirements.lock '}{wheel.name} "
                             f"({seconds:.0f} s; the venv {mib(venv):.0f} MiB)", r.stdout + r.stderr)
    return venv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def smoke(venv: Path, here: Path, sidecar_timeout: float) -> None:
    """The commands a new user runs, from ``here`` (no checkout, no datasets/, no DPROBE_DATA_DIR)."""
    dprobe = str(venv / "bin" / "dprobe")
    env = {k: v for k, v in os.environ.items() if k not in ("DPROBE_DATA_DIR", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    r = run([dprobe, "--help"], cwd=here, env=env, timeout=60)
    check(r.returncode == 0 and "sidecar" in r.stdout, "dprobe --help", r.stdout + r.stderr)

    port = free_port()
    log = here / "sidecar.log"
    with log.open("w") as out:
        proc = subprocess.Popen([dprobe, "sidecar", "--listen-address", "127.0.0.1", "--port", str(port),
                                 "--forecast-interval", "1"], cwd=here, env=env, stdout=out, stderr=subprocess.STDOUT)
    text, deadline = "", time.monotonic() + sidecar_timeout
    try:
        while not FORECAST.search(text) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
                    text = answer.read().decode()
            except OSError:
                pass
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    said = log.read_text()
    check(bool(FORECAST.search(text)), "dprobe sidecar serves forecasts on /metrics (p90 of GPU memory)",
          f"exit status {proc.returncode}; its log:\n{said[-3000:]}")
    check("the sample in the package" in said, "the sidecar replays the sample in the package and says so", said)
    check(proc.returncode == 0, "the sidecar stops cleanly on SIGTERM", said[-3000:])

    r = run([dprobe, "train"], cwd=here, env=env, timeout=120)
    lines = r.stderr.strip().splitlines()
    check(r.returncode != 0 and len(lines) == 1 and all(w in lines[0] for w in ("DPROBE_DATA_DIR", "datasets",
                                                                                "paths.data_dir=")),
          f"dprobe train without data: one line, exit status {r.returncode}", r.stderr)

    if run([str(venv / "bin" / "python"), "-c", "import kubernetes"], cwd=here, env=env).returncode != 0:
        r = run([dprobe, "scaler", "--leader-election", "--prometheus-url", f"http://127.0.0.1:{free_port()}"],
                cwd=here, env=env, timeout=60)
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 2 and len(lines) == 1 and "pip install 'dprobe[scaler]'" in lines[0],
              "dprobe scaler --leader-election without the Kubernetes client names the scaler extra", r.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offline", action="store_true",
                        help="no registry: build without isolation, the dependencies from this venv")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it (default: a temporary one)")
    parser.add_argument("--sidecar-timeout", type=float, default=120.0,
                        help="seconds the sidecar has to serve a forecast (default 120)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="dprobe-wheel-")) if args.keep is None else args.keep.resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        wheel = build_wheel(work, args.offline)
        venv = install(work, wheel, args.offline)
        here = work / "elsewhere"
        here.mkdir(exist_ok=True)
        smoke(venv, here, args.sidecar_timeout)
    except (SmokeError, subprocess.TimeoutExpired) as exc:
        print(f"wheel smoke: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print("wheel smoke: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
