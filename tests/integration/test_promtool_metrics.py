"""`promtool check metrics` on the sidecar's /metrics: the only lint is the documented one, the `quantile`
label of the forecast gauges (a contract: docs/sidecar.md, "promtool check metrics")."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import urllib.request

import pytest

from dprobe.forecaster.loading import open_forecaster
from dprobe.services.sidecar.config import SidecarConfig
from dprobe.services.sidecar.service import Sidecar
from dprobe.services.sources.synthetic import SyntheticSource

pytestmark = [pytest.mark.integration, pytest.mark.slow,  # a live sidecar, torch for the job profile
              pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool (apt-get install prometheus)")]

QUANTILE_LINT = re.compile(r'^(\w+) non-summary metrics should not have "quantile" label$')
# gauges of forecast quantiles: dprobe_predicted_* is the documented contract, the job profiles follow it
QUANTILE_GAUGES = {"dprobe_predicted_gpu_memory_bytes", "dprobe_predicted_gpu_utilization_ratio",
                   "dprobe_job_predicted_gpu_memory_bytes", "dprobe_job_predicted_allocator_peak_bytes",
                   "dprobe_job_predicted_gpu_utilization_ratio", "dprobe_job_predicted_step_seconds"}


def lint(text: str) -> list[str]:
    """promtool's lint lines for a /metrics page (its problems, one per line)."""
    out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    return [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]


def test_promtool_lints_what_it_should() -> None:
    """The check itself: a counter without _total and a gauge with a quantile label are both reported."""
    text = ("# HELP jobs_done Jobs done.\n# TYPE jobs_done counter\njobs_done 1\n"
            "# HELP x_bytes X.\n# TYPE x_bytes gauge\nx_bytes{quantile=\"0.9\"} 1\n")
    found = lint(text)
    assert any("jobs_done" in line and "_total" in line for line in found), found
    assert any(QUANTILE_LINT.match(line) for line in found), found


def test_sidecar_metrics_lint_only_the_documented_quantile_label() -> None:
    config = SidecarConfig(listen_address="127.0.0.1", port=0, source="synthetic", sample_interval=0.05,
                           forecast_interval=0.3, step_seconds=0.1, window_seconds=5, horizons=[1, 2], min_points=4,
                           stale_after=120, drop_after=300, model="ewma",
                           jobs={"synthetic/pod-0": "torchvision:resnet18 batch=8 precision=bf16"})
    sidecar = Sidecar(config, sources=[SyntheticSource(3)], model=open_forecaster(None, "ewma"))
    sidecar.start()
    try:
        url = f"http://127.0.0.1:{sidecar.server.port}/metrics"
        deadline = time.time() + 60
        while True:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            # the forecasts, and the job's profile once made (or its failure counted)
            if "dprobe_predicted_gpu_memory_bytes{" in text and (
                    "dprobe_job_info{" in text or re.search(r"^dprobe_job_profile_errors_total\S* [1-9]", text, re.M)):
                break
            assert time.time() < deadline, "the sidecar never served its forecasts and the job's profile"
            time.sleep(0.3)
    finally:
        sidecar.stop()
    lines = lint(text)
    other = [line for line in lines if not QUANTILE_LINT.match(line)]
    assert other == [], other
    flagged = {QUANTILE_LINT.match(line).group(1) for line in lines}
    assert {"dprobe_predicted_gpu_memory_bytes", "dprobe_predicted_gpu_utilization_ratio"} <= flagged <= QUANTILE_GAUGES
