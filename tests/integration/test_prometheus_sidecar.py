"""The sidecar in replay mode, scraped by a real Prometheus: the stored forecasts are the model's."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from dprobe.forecasting.base import ForecastInput
from dprobe.forecasting.baselines import make_baseline
from dprobe.forecasting.loading import open_forecaster
from dprobe.sidecar.config import SidecarConfig
from dprobe.sidecar.service import Sidecar
from dprobe.sidecar.window import METRICS
from dprobe.sources.replay import ReplaySource

pytestmark = pytest.mark.integration


def trace_rows() -> dict[str, list[tuple[float, float, float]]]:
    """Three pods with different, changing memory and duty cycle: pod -> [(t, duty %, bytes)]."""
    rng = np.random.default_rng(0)
    return {pod: [(57.0 * i, round((20 * p + 30 * np.sin(i / 7) + 40) % 100, 3),
                   (p + 1) * 2**30 + int(rng.integers(0, 2**28))) for i in range(400)]
            for p, pod in enumerate(("pod-a", "pod-b", "pod-c"))}


def test_prometheus_scrapes_the_forecasts(prometheus_server, alibaba_layout, tmp_path: Path) -> None:
    config = SidecarConfig(listen_address="127.0.0.1", port=0, source="replay", sample_interval=0.1,
                           forecast_interval=0.5, step_seconds=0.5, window_seconds=30, horizons=[2, 5, 10],
                           min_points=4, stale_after=120, drop_after=300, model="ewma")
    source = ReplaySource("alibaba", alibaba_layout(tmp_path / "trace", trace_rows()), speed=57 * 4)
    sidecar = Sidecar(config, sources=[source], model=open_forecaster(None, "ewma"))
    sidecar.start()
    try:
        with prometheus_server([f"127.0.0.1:{sidecar.server.port}"]) as prom:
            deadline = time.time() + 40
            while len(prom.query("dprobe_predicted_gpu_memory_bytes")) < 3 * 3 * 3:
                assert time.time() < deadline, "Prometheus never stored the predicted series"
                time.sleep(0.5)
            # freeze: stop sampling and the forecast loop, forecast once more, keep serving that
            sidecar.stop_event.set()
            for t in sidecar._threads:
                t.join(5)
            snap = sidecar.engine.cycle()
            time.sleep(2.5)  # at least two scrapes of the frozen state

            windows = sidecar.store.windows(list(snap.targets))
            for metric in METRICS:
                name = f"dprobe_{'predicted_' + metric}"
                result = prom.query(name)
                assert len(result) == len(snap.targets) * 3 * 3
                got = {}
                for r in result:
                    labels = r["metric"]
                    assert set(labels) == {"__name__", "target", "horizon_seconds", "quantile", "instance", "job"}
                    got[(labels["target"], labels["horizon_seconds"], labels["quantile"])] = float(r["value"][1])
                assert {k[0] for k in got} == {"pod-a", "pod-b", "pod-c"}
                # what the model produces for the replayed window, computed here independently
                fc = make_baseline("ewma").predict(ForecastInput(
                    values=windows[metric], metric=metric, leads=(4, 10, 20), step_seconds=0.5))
                lo, hi = (0.0, 1.0) if "utilization" in metric else (0.0, np.inf)
                expected = np.sort(np.clip(fc.quantiles, lo, hi), axis=-1)
                for i, target in enumerate(snap.targets):
                    for j, h in enumerate(("2", "5", "10")):
                        for k, q in enumerate(("0.5", "0.9", "0.99")):
                            assert got[(target, h, q)] == pytest.approx(expected[i, j, k], rel=1e-9)
            observed = prom.query("dprobe_observed_gpu_utilization_ratio")
            assert {r["metric"]["target"] for r in observed} == {"pod-a", "pod-b", "pod-c"}
            assert all(0.0 <= float(r["value"][1]) <= 1.0 for r in observed)
            info = prom.query("dprobe_model_info")
            assert info[0]["metric"]["kind"] == "baseline:ewma"
            hist = prom.query("dprobe_forecast_seconds_count")
            assert float(hist[0]["value"][1]) >= 1
    finally:
        sidecar.stop()
