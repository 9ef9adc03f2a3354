"""The sidecar: configuration, windows, the forecast cycle, fault handling, checkpoints, shutdown."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from dprobe.core.names import SIDECAR_METRICS as METRICS
from dprobe.forecaster.base import QUANTILES, Forecast, ForecastInput
from dprobe.forecaster.baselines import make_baseline
from dprobe.forecaster.loading import (
    FORECASTER_LOADERS,
    SHIPPED_FORECASTER,
    CheckpointError,
    load_forecaster,
    open_forecaster,
    serves,
)
from dprobe.services.sidecar.annotations import AnnotationPolicy, read_annotations
from dprobe.services.sidecar.config import OPTIONS, SidecarConfig, add_arguments, load_config
from dprobe.services.sidecar.engine import ForecastEngine
from dprobe.services.sidecar.graphs import GraphResolver
from dprobe.services.sidecar.poller import SourcePoller
from dprobe.services.sidecar.service import Sidecar
from dprobe.services.sidecar.window import WindowStore
from dprobe.services.sources import Sample, SourceError
from dprobe.services.sources.synthetic import SyntheticSource

REPO = Path(__file__).resolve().parents[1]


# configuration ---------------------------------------------------------------------------------
def _flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_config_precedence_file_env_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text("port: 9000\nsource: dcgm\ndcgm:\n  url: http://dcgm:9400/metrics\nhorizons: [60, 600]\n"
                   "graphs:\n  'team-a/*': /graphs/resnet50.json\n")
    env = {"DPROBE_SIDECAR_PORT": "9100", "DPROBE_SIDECAR_STALE_AFTER": "45", "DPROBE_SIDECAR_CONFIG": str(cfg)}
    c = load_config(_flags("--port", "9200", "--no-nvml-per-process"), env=env)
    assert c.port == 9200 and c.stale_after == 45.0 and c.source == "dcgm"
    assert c.dcgm_url == "http://dcgm:9400/metrics" and c.horizons == [60, 600] and not c.nvml_per_process
    assert c.graphs == {"team-a/*": "/graphs/resnet50.json"}
    assert load_config({}, env={}).horizons == [60, 300, 900]
    assert load_config({}, env={"DPROBE_SIDECAR_HORIZONS": "300,60"}).horizons == [60, 300]
    # only the URL of the source in use is checked
    assert load_config({}, env={"DPROBE_SIDECAR_SOURCE": "dcgm", "DPROBE_SIDECAR_PROMETHEUS_URL": "x"}).source == "dcgm"


@pytest.mark.parametrize("env,message", [
    ({"DPROBE_SIDECAR_PORT": "http"}, "DPROBE_SIDECAR_PORT"),
    ({"DPROBE_SIDECAR_SOURCE": "gpu"}, "must be one of"),
    ({"DPROBE_SIDECAR_REPLAY_LOOP": "maybe"}, "true/false"),
    ({"DPROBE_SIDECAR_HORIZONS": "0"}, "horizon_seconds"),
    # a URL without its scheme would only show as a source failing for ever
    ({"DPROBE_SIDECAR_SOURCE": "prometheus", "DPROBE_SIDECAR_PROMETHEUS_URL": "prometheus:9090"}, "prometheus_url"),
    ({"DPROBE_SIDECAR_SOURCE": "dcgm", "DPROBE_SIDECAR_DCGM_URL": "http:///metrics"}, "dcgm_url"),
    # nonsense that was accepted, and only showed later (or never)
    ({"DPROBE_SIDECAR_MAX_TARGETS": "-3"}, "max_targets must be positive, or 0 for as many as the memory limit"),
    ({"DPROBE_SIDECAR_MEMORY_LIMIT_MIB": "-512"}, "memory_limit_mib must be positive, or 0"),
    ({"DPROBE_SIDECAR_JOB_RSS_LIMIT_MIB": "nan"}, "job_rss_limit_mib must be positive, or 0"),
    ({"DPROBE_SIDECAR_MIN_POINTS": "0"}, "min_points must be at least 1"),
    ({"DPROBE_SIDECAR_HORIZON_SECONDS": "5,60"}, "horizon_seconds must be at least step_seconds"),
    ({"DPROBE_SIDECAR_HORIZONS": "60,inf"}, "option horizons: item 'inf' of the list: expected a whole number"),
    ({"DPROBE_SIDECAR_STALE_AFTER": "nan"}, "stale_after must be positive"),
    ({"DPROBE_SIDECAR_STALE_AFTER": "inf"}, "stale_after must be positive"),
    ({"DPROBE_SIDECAR_SAMPLE_INTERVAL": "60"}, "stale_after .* must not be shorter than sample_interval"),
    ({"DPROBE_SIDECAR_MAX_BACKOFF": "0.5"}, "max_backoff .* must not be shorter than sample_interval"),
    ({"DPROBE_SIDECAR_MAX_CLOCK_SKEW": "-1"}, "max_clock_skew"),
    ({"DPROBE_SIDECAR_REPLAY_SPEED": "-60"}, "replay_speed"),
    ({"DPROBE_SIDECAR_REPLAY_MAX_TARGETS": "-1"}, "replay_max_targets"),
    ({"DPROBE_SIDECAR_SOURCE": "synthetic", "DPROBE_SIDECAR_SYNTHETIC_TARGETS": "0"}, "synthetic_targets"),
])
def test_config_errors_name_the_option(env: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_config({}, env=env)


def test_example_config_loads() -> None:
    c = load_config({"config": str(REPO / "conf" / "sidecar.example.yaml")}, env={})
    assert c.source == "dcgm" and c.horizons == [60, 300, 900] and "team-b/bert-*" in c.graphs
    assert c.model == "dprobe" and c.checkpoint is None


def test_config_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("prot: 1\n")
    with pytest.raises(ValueError, match="unknown option.*prot"):
        load_config({"config": str(bad)}, env={})
    bad.write_text("port: [\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config({"config": str(bad)}, env={})


def test_help_documents_every_option() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    text = parser.format_help()
    for name in OPTIONS.fields:  # every option, those of the groups (dcgm_url, ...) too
        assert "--" + name.replace("_", "-") in text and "DPROBE_SIDECAR_" + name.upper() in text


@pytest.mark.parametrize("service", ["sidecar", "scaler"])
def test_help_lists_each_option_once_in_its_section(service) -> None:
    """--help's sections: each flag under the group its options set declares, "general" for the rest."""
    import importlib

    options = importlib.import_module(f"dprobe.services.{service}.config").OPTIONS
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    placed = {a.dest: g.title for g in parser._action_groups for a in g._group_actions if a.dest in options.fields}
    assert set(placed) == set(options.fields)  # every option, each in one section
    assert {t.removesuffix(" options") for t in placed.values()} == {"general", *options.groups}  # none empty
    for name, title in placed.items():
        assert title == f"{options.group_of(name)} options"
    if service == "scaler":
        assert placed["sharing_policy"] == "GPU shares options" and placed["scale_up_policies"].startswith("policy")
        assert placed["prometheus_ca_file"].startswith("forecast and Prometheus")
    from dprobe.core.options import OptionSet

    with pytest.raises(ValueError, match="no option 'nope'"):
        OptionSet(options.cls, "X_", "x", {"typo": ("nope",)})


# windows ---------------------------------------------------------------------------------------
def test_window_bins_gaps_and_wrap() -> None:
    store = WindowStore(step=10.0, length=4)
    store.add([Sample("a", 100.0, 1.0, 0.1), Sample("a", 105.0, 3.0, 0.3), Sample("a", 125.0, 5.0, None)])
    w = store.windows(["a"])
    np.testing.assert_array_equal(w["gpu_memory_bytes"][0], [np.nan, 2.0, np.nan, 5.0])
    np.testing.assert_allclose(w["gpu_utilization_ratio"][0], [np.nan, 0.2, np.nan, np.nan])
    store.add([Sample("a", t, t, None) for t in (130.0, 140.0, 150.0, 160.0)])  # ring wraps
    np.testing.assert_array_equal(store.windows(["a"])["gpu_memory_bytes"][0], [130, 140, 150, 160])
    store.add([Sample("a", 50.0, 99.0, None)])  # older than the window: ignored
    np.testing.assert_array_equal(store.windows(["a"])["gpu_memory_bytes"][0], [130, 140, 150, 160])


def test_window_freshness_follows_the_newest_finite_sample() -> None:
    """A sample without a finite reading neither refreshes its target nor takes a row (it did before: all-NaN
    answers kept a target fresh); the latest sample holds only finite readings."""
    store = WindowStore(step=10.0, length=4)
    store.add([Sample("a", 100.0, 1.0, 0.5)])
    store.add([Sample("a", 130.0, float("nan"), None), Sample("b", 130.0, None, float("inf")),
               Sample("c", float("inf"), 1.0, 0.5)])
    assert store.snapshot_latest()["a"].ts == 100.0 and store.targets() == ["a"]
    store.add([Sample("a", 140.0, float("nan"), 0.25)])
    latest = store.snapshot_latest()["a"]
    assert (latest.ts, latest.memory_bytes, latest.utilization_ratio) == (140.0, None, 0.25)
    store.add([Sample("a", 150.0, 1.0, 0.5, extra={"power_watts": float("nan"), "sm_clock_hertz": 1.5e9,
                                                   "memory_total_bytes": -1.0})])
    assert store.snapshot_latest()["a"].extra == {"sm_clock_hertz": 1.5e9}  # further readings: usable ones only


def test_window_memory_is_bounded_and_rows_reused() -> None:
    store = WindowStore(step=1.0, length=8, max_targets=100, initial_capacity=4)
    for round_ in range(20):  # 20 generations of 50 short-lived targets
        t0 = round_ * 100.0
        store.add([Sample(f"gen{round_}/pod{i}", t0, 1.0, 0.5) for i in range(50)])
        store.drop_older_than(t0 - 1)
    assert len(store.targets()) == 50 and store._bins.shape[0] <= 100
    store.add([Sample(f"extra{i}", 2000.0, 1.0, 0.5) for i in range(80)])  # 50 rows free, then 30 shed
    assert len(store.targets()) == 100 and store.shed_total == {"least_recent": 30, "full": 0}


# forecast engine -------------------------------------------------------------------------------
class Echo:
    """A forecaster whose quantiles are the last finite value times (1, 1.1, 1.2)."""

    name = "echo"

    def __init__(self) -> None:
        self.batches: list[ForecastInput] = []

    def predict(self, batch: ForecastInput) -> Forecast:
        self.batches.append(batch)
        last = np.array([row[~np.isnan(row)][-1] for row in batch.values])
        q = last[:, None, None] * np.array([1.0, 1.1, 1.2])[None, None, :] * np.ones((1, len(batch.leads), 1))
        return Forecast(point=q[..., 0], quantiles=q, leads=batch.leads)


def test_engine_batches_fresh_targets_and_skips_stale() -> None:
    now = [1000.0]
    store = WindowStore(step=1.0, length=30)
    for k in range(10):
        store.add([Sample("fresh", 990.0 + k, 100.0 + k, 0.5), Sample("stale", 900.0 + k, 5.0, 0.5)])
    store.add([Sample("short", 999.0, 1.0, 0.2)])
    model = Echo()
    engine = ForecastEngine(store, model, horizons=[5, 30], stale_after=30, drop_after=60, min_points=3,
                            clock=lambda: now[0])
    snap = engine.cycle()
    assert snap is not None and snap.targets == ("fresh",)  # stale: too old; short: too little history
    assert [b.metric for b in model.batches] == ["gpu_memory_bytes", "gpu_utilization_ratio"]
    assert model.batches[0].leads == (5, 30) and model.batches[0].step_seconds == 1.0
    np.testing.assert_allclose(snap.quantiles["gpu_memory_bytes"][0, 1], [109.0, 119.9, 130.8])
    np.testing.assert_allclose(snap.quantiles["gpu_utilization_ratio"][0, 0], [0.5, 0.55, 0.6])
    now[0] = 1000.0 + 61
    engine.cycle()
    assert store.targets() == []  # every target vanished for longer than drop_after


def test_engine_clips_and_counts_model_failures(caplog: pytest.LogCaptureFixture) -> None:
    store = WindowStore(step=1.0, length=10)
    for k in range(5):
        store.add([Sample("a", 100.0 + k, 1e9, 0.9)])
    engine = ForecastEngine(store, Echo(), horizons=[3], stale_after=30, drop_after=60, clock=lambda: 105.0)
    snap = engine.cycle()
    assert snap.quantiles["gpu_utilization_ratio"].max() == 1.0  # 0.9 * 1.2 clipped to a ratio

    class Broken:
        name = "broken"

        def predict(self, batch):
            raise RuntimeError("bad weights")

    engine.forecaster = Broken()
    with caplog.at_level(logging.INFO, logger="dprobe"):
        for _ in range(3):
            assert engine.cycle() is None
    assert engine.errors_total == 3 and engine.snapshot is snap
    assert len([r for r in caplog.records if "forecasting failed" in r.getMessage()]) == 1


def test_engine_withdraws_a_metric_whose_readings_stopped() -> None:
    """Utilisation NaN (missing) while memory goes on: the target stays fresh, its memory is forecast, and its
    utilisation forecast is withdrawn once its last reading is older than stale_after (not frozen as fresh)."""
    store = WindowStore(step=1.0, length=60)
    for k in range(20):
        store.add([Sample("a", 100.0 + k, 1e9, 0.5)])
    for k in range(20, 40):
        store.add([Sample("a", 100.0 + k, 1e9, None)])  # utilisation missing for 20 s
    now = [140.0]
    engine = ForecastEngine(store, Echo(), horizons=[5], stale_after=10, drop_after=60, clock=lambda: now[0])
    snap = engine.cycle()
    assert snap.targets == ("a",) and snap.quantiles["gpu_memory_bytes"][0, 0, 0] == 1e9
    assert np.isnan(snap.quantiles["gpu_utilization_ratio"]).all()
    store.add([Sample("a", 140.0, 1e9, 0.75)])  # back: forecast again
    assert engine.cycle().quantiles["gpu_utilization_ratio"][0, 0, 0] == 0.75


def test_graph_resolution_without_graph_module(tmp_path: Path) -> None:
    ann = tmp_path / "annotations"
    ann.write_text('dprobe.io/model-graph="bert.json"\nother="x"\n')
    assert read_annotations(ann)["dprobe.io/model-graph"] == "bert.json"
    r = GraphResolver({"team-a/*": "torchvision:resnet50"}, graph_file="", annotations_file=str(ann),
                      policy=AnnotationPolicy(graph_dir=str(tmp_path)))  # annotations name files in graph_dir
    bert = str(tmp_path.resolve() / "bert.json")
    assert r.reference("team-a/x") == "torchvision:resnet50" and r.reference("b/y") == bert
    assert r.graph("b/y") is None  # file missing: forecast from metrics alone, no exception
    assert not GraphResolver().active


def test_graph_follows_a_changed_annotation(tmp_path: Path) -> None:
    ann = tmp_path / "annotations"
    ann.write_text('other="x"\n')
    r = GraphResolver({"team-a/*": "pinned.json"}, graph_file="/graphs/default.json", annotations_file=str(ann),
                      policy=AnnotationPolicy(graph_dir=str(tmp_path)))
    r._by_target["b/y"] = "cached"  # stands for a graph loaded for the old reference
    assert r.reference("b/y") == "/graphs/default.json" and not r.refresh()
    new = tmp_path / "annotations.new"
    new.write_text(f'other="x"\ndprobe.io/model-graph="{tmp_path}/gpt2.json"\n')
    new.replace(ann)  # as the kubelet swaps the file
    gpt2 = str(tmp_path.resolve() / "gpt2.json")
    assert r.refresh() and r.reference("b/y") == gpt2 and r.reference("team-a/x") == "pinned.json"
    assert "b/y" not in r._by_target  # loaded again on the next forecast
    assert not r.refresh()


# source faults ---------------------------------------------------------------------------------
class Flaky:
    name = "flaky"

    def __init__(self) -> None:
        self.fail = False
        self.calls = 0

    def poll(self):
        self.calls += 1
        if self.fail:
            raise SourceError("connection refused")
        return [Sample("ns/p", time.time(), 1e9, 0.5)]

    def close(self) -> None:
        pass


def test_poller_backoff_and_one_log_line_per_state_change(caplog: pytest.LogCaptureFixture) -> None:
    src = Flaky()
    got: list = []
    poller = SourcePoller(src, lambda s, n: got.extend(s), interval=1.0, max_backoff=8.0)
    with caplog.at_level(logging.INFO, logger="dprobe"):
        assert poller.poll_once()
        src.fail = True
        delays = []
        for _ in range(6):
            assert not poller.poll_once()
            delays.append(poller.next_delay())
        src.fail = False
        assert poller.poll_once() and poller.next_delay() == 1.0
    assert poller.errors_total == 6 and poller.up
    assert 1.6 <= delays[0] <= 2.0 and all(6.4 <= d <= 8.0 for d in delays[3:])
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("failing" in m for m in msgs) == 1 and sum("recovered after 6" in m for m in msgs) == 1


class Scripted:
    """A source that answers what the test says: ``reply`` is the list of samples of the next polls."""

    name = "scripted"

    def __init__(self) -> None:
        self.reply: list[Sample] = []

    def poll(self):
        return list(self.reply)

    def close(self) -> None:
        pass


def test_poller_all_nan_empty_and_future_answers_are_failed_polls(caplog: pytest.LogCaptureFixture) -> None:
    """A poll without one finite reading (all NaN, empty, or stamped in the future) is a failed poll, counted,
    and the source is not up; what is refused is counted by reason, and logged once per reason."""
    src, got = Scripted(), []
    poller = SourcePoller(src, lambda s, n: got.extend(s), interval=1.0, max_backoff=8.0, max_skew=5.0,
                          clock=lambda: 1000.0)
    src.reply = [Sample("ns/p", 1000.0, 1e9, 0.5)]
    assert poller.poll_once() and poller.up
    with caplog.at_level(logging.WARNING, logger="dprobe"):
        for reply in ([Sample("ns/p", 1000.0, float("nan"), float("nan"))], [],
                      [Sample("ns/p", 1600.0, 1e9, 0.5)],  # a source clock 600 s ahead
                      [Sample("ns/p", 1000.0, float("nan"), float("nan"))]):
            src.reply = reply
            assert not poller.poll_once() and not poller.up
    assert poller.errors_total == 4 and len(got) == 1
    assert poller.rejected == {"nan": 4, "infinite": 0, "negative": 0, "ratio_above_one": 0, "future_timestamp": 1,
                               "bad_timestamp": 0}
    assert "no usable reading in the answer (1 sample: 2 nan)" in poller.last_error
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("readings refused (nan)" in m for m in msgs) == 1 and sum("failing" in m for m in msgs) == 1
    src.reply = [Sample("ns/p", 1003.0, -1.0, 0.5), Sample("ns/q", 1000.0, 1e9, 55.0)]
    assert poller.poll_once() and poller.up  # a finite reading left: the poll succeeds, the rest is counted
    assert [(s.target, s.memory_bytes, s.utilization_ratio) for s in got[1:]] == [("ns/p", None, 0.5),
                                                                                  ("ns/q", 1e9, None)]
    assert poller.rejected["negative"] == 1 and poller.rejected["ratio_above_one"] == 1


def _fast_config(**kw) -> SidecarConfig:
    base = dict(listen_address="127.0.0.1", port=0, sample_interval=0.05, forecast_interval=0.1, step_seconds=0.1,
                window_seconds=5.0, horizons=[1, 2], min_points=3, stale_after=0.6, drop_after=30.0,
                max_backoff=0.2)
    base.update(kw)
    return SidecarConfig(**base)


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=2) as r:
        return r.read().decode()


def _by_target(text: str, name: str) -> dict[str, list[float]]:
    """The values of metric ``name`` in /metrics text, by their ``target`` label."""
    out: dict[str, list[float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out.setdefault(s.labels["target"], []).append(s.value)
    return out


@pytest.mark.slow
def test_sidecar_keeps_serving_when_its_source_fails() -> None:
    src = Flaky()
    sc = Sidecar(_fast_config(), sources=[src], model=open_forecaster(None, "last_value"))
    sc.start()
    try:
        deadline = time.time() + 5
        while "ns/p" not in _by_target(_metrics(sc.server.url), "dprobe_predicted_gpu_memory_bytes"):
            assert time.time() < deadline
            time.sleep(0.05)
        assert sc.ready()[0]
        src.fail = True
        time.sleep(1.2)  # past stale_after: forecasts withdrawn, staleness reported
        text = _metrics(sc.server.url)
        assert "ns/p" not in _by_target(text, "dprobe_predicted_gpu_memory_bytes")
        assert "ns/p" not in _by_target(text, "dprobe_observed_gpu_memory_bytes")
        [age] = _by_target(text, "dprobe_last_sample_age_seconds")["ns/p"]
        assert age > 0.6
        assert 'dprobe_source_up{source="flaky"} 0.0' in text
        errors = float(text.split('dprobe_source_errors_total{source="flaky"} ')[1].split()[0])
        assert 1 <= errors < 20  # backed off, not hammering
        src.fail = False
        time.sleep(0.6)
        assert "ns/p" in _by_target(_metrics(sc.server.url), "dprobe_predicted_gpu_memory_bytes")
    finally:
        t = time.monotonic()
        sc.stop()
        assert time.monotonic() - t < 3


def test_sidecar_counts_refused_samples_and_says_when_it_is_not_ready() -> None:
    """Samples from a clock 600 s ahead neither make a target fresh nor its forecasts current; they, and NaN,
    are counted in dprobe_rejected_samples_total; /readyz says the source is failing (it is on no workload's
    pod), and recovers with the source."""
    src = Scripted()
    sc = Sidecar(_fast_config(stale_after=0.5), sources=[src], model=open_forecaster(None, "last_value"))
    src.reply = [Sample("ns/p", time.time(), 1e9, 0.5)]
    sc.pollers[0].poll_once()
    assert sc.ready()[0]
    src.reply = [Sample("ns/p", time.time() + 600, 2e9, 0.6), Sample("ns/q", time.time(), float("nan"), None)]
    sc.pollers[0].poll_once()
    sc.pollers[0].poll_once()
    ready, why = sc.ready()
    assert not ready and "source scripted failing: no usable reading" in why
    assert sc.store.snapshot_latest()["ns/p"].memory_bytes == 1e9  # the future sample was not stored
    time.sleep(0.6)  # past stale_after: stale, as it is (it stayed "fresh" for the 600 s of skew before)
    text = sc.collector.render_text().decode()
    assert "ns/p" not in _by_target(text, "dprobe_observed_gpu_memory_bytes")
    assert _by_target(text, "dprobe_last_sample_age_seconds")["ns/p"][0] > 0.5
    rejected = {s.labels["reason"]: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                if s.name == "dprobe_rejected_samples_total" and s.labels["source"] == "scripted"}
    assert rejected["future_timestamp"] == 2 and rejected["nan"] == 2 and rejected["negative"] == 0
    assert 'dprobe_source_errors_total{source="scripted"} 2.0' in text
    src.reply = [Sample("ns/p", time.time(), 1e9, 0.5)]
    sc.pollers[0].poll_once()
    assert sc.ready()[0]


@pytest.mark.parametrize(("source", "option", "path"), [("prometheus", "prometheus_url", ""),
                                                         ("dcgm", "dcgm_url", "/metrics")])
def test_readyz_says_why_there_is_no_sample_yet(http_peer, source: str, option: str, path: str) -> None:
    """A source refused from its first poll (HTTP 401 from a secured Prometheus or dcgm-exporter): /readyz
    said "no sample yet"; it says the source's last error now."""
    with http_peer(lambda _path: (401, "Unauthorized\n", 0.0)) as url:
        config = _fast_config(source=source, **{option: url + path}, max_backoff=0.5)
        sc = Sidecar(config, model=open_forecaster(None, "last_value"))
        assert sc.ready() == (False, "no sample yet")  # before the first poll
        sc.start()
        try:
            deadline = time.monotonic() + 10
            while not sc.pollers[0].errors_total:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(sc.server.url + "/readyz", timeout=5)
            why = answer.value.read().decode()
        finally:
            sc.stop()
    assert answer.value.code == 503
    assert why.startswith(f"not ready: no sample yet: source {source} failing: {url}"), why
    assert "HTTP 401 Unauthorized: the server wants credentials, no credentials given" in why
    if source == "dcgm":  # it has no credential options to suggest
        assert "bearer_token_file" not in why and "this source sends none" in why


@pytest.mark.slow
def test_horizons_beyond_the_models_longest_lead_stop_the_start(tmp_path: Path) -> None:
    """The shipped model is trained up to 30 steps of 57 s: a horizon of 2 h failed every forecast cycle; now
    the start stops with one line naming the option (and so does a window that cannot hold min_points)."""
    shipped = open_forecaster(None, "dprobe", metrics=METRICS)
    with pytest.raises(ValueError, match=r"cannot serve horizons 60,7200 at step_seconds 10: .*1710 s.*7200 s"):
        Sidecar(_fast_config(step_seconds=10.0, window_seconds=0, horizons=[60, 7200]), sources=[Flaky()],
                model=shipped)
    sc = Sidecar(_fast_config(step_seconds=10.0, window_seconds=0, horizons=[60, 300, 900]), sources=[Flaky()],
                 model=shipped)
    assert sc.engine.horizons == (60, 300, 900)
    with pytest.raises(ValueError, match="min_points 60 is more than the window holds"):
        Sidecar(_fast_config(min_points=60), sources=[Flaky()], model=open_forecaster(None, "last_value"))
    r = subprocess.run(_sidecar_cmd("--source", "synthetic", "--horizons", "60,7200"), cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    [line] = [x for x in r.stderr.splitlines() if "error" in x]  # the rest: the start's log lines
    assert line.startswith("dprobe sidecar: error: the forecaster cannot serve horizons 60,7200"), line


# checkpoints -----------------------------------------------------------------------------------
def _save(path: Path, obj) -> Path:
    torch.save(obj, path)
    return path


def test_load_forecaster_baseline_and_registry(tmp_path: Path) -> None:
    assert load_forecaster(None, "ewma").name == "ewma"

    def build(ckpt: dict):
        model = make_baseline("last_value")
        model.scale = float(ckpt["scale"].item())
        return model

    FORECASTER_LOADERS["test-kind"] = build
    try:
        loaded = open_forecaster(_save(tmp_path / "ok.pt", {"kind": "test-kind", "dprobe_version": "0.1.0",
                                                             "scale": torch.tensor(2.0)}))
        assert loaded.kind == "test-kind" and loaded.forecaster.scale == 2.0 and loaded.checkpoint.endswith("ok.pt")
        fc = loaded.forecaster.predict(ForecastInput(np.ones((2, 20)), "gpu_memory_bytes", (1, 5), 10.0))
        assert fc.quantiles.shape == (2, 2, len(QUANTILES))
    finally:
        del FORECASTER_LOADERS["test-kind"]


def test_bad_checkpoints_name_the_file_and_why(tmp_path: Path) -> None:
    good = _save(tmp_path / "good.pt", {"kind": "nope", "dprobe_version": "0.1.0", "w": torch.zeros(1000)})
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(os.urandom(256))
    cases = {
        tmp_path / "missing.pt": "no such file",
        truncated: "cannot be read",
        garbage: "cannot be read",
        _save(tmp_path / "list.pt", [1, 2]): "holds a list",
        _save(tmp_path / "nokind.pt", {"state_dict": {}}): "missing key",
        good: "unknown model kind 'nope'",
        _save(tmp_path / "future.pt", {"kind": "nope", "dprobe_version": "7.0.0"}): "incompatible",
    }
    for path, why in cases.items():
        with pytest.raises(CheckpointError, match=why) as err:
            load_forecaster(path, "ewma")
        assert str(path) in str(err.value)
    # a file of objects a weights-only load refuses: the finding, not torch's advice to load it unsafely
    objects = _save(tmp_path / "objects.pt", {"kind": "nope", "dprobe_version": "0.1.0", "where": Path("/x")})
    with pytest.raises(CheckpointError, match="weights-only load refuses it .*Unsupported global") as err:
        load_forecaster(objects, "ewma")
    assert "weights_only" not in str(err.value)
    fallback = open_forecaster(truncated, "moving_median", fallback_on_error=True)
    assert fallback.forecaster.name == "moving_median" and "truncated.pt" in fallback.fallback_reason


def test_the_shipped_forecaster_is_the_default_and_the_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Without --checkpoint the sidecar runs the forecaster shipped with dprobe (ONNX: no torch needed); a
    checkpoint that cannot be used falls back to it; --model NAME picks a baseline instead."""
    import dprobe.forecaster.loading as loading

    config = load_config({}, env={})
    assert (config.checkpoint, config.model) == (None, "dprobe")
    loaded = open_forecaster(config.checkpoint, config.model, metrics=METRICS)
    assert loaded.kind == "dprobe-forecaster (onnx)" and loaded.checkpoint == str(SHIPPED_FORECASTER)
    assert all(serves(loaded.forecaster, m) for m in METRICS)
    y = np.linspace(2e9, 4e9, 800)[None]  # a rising memory series, 10 s steps
    fc = loaded.forecaster.predict(ForecastInput(y, "gpu_memory_bytes", (6, 30), 10.0))
    assert np.isfinite(fc.quantiles).all() and (np.diff(fc.quantiles, axis=-1) >= 0).all()
    assert 3.5e9 < fc.point[0, 0] < 5e9  # near where the series is
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not onnx")
    fallback = open_forecaster(str(broken), "dprobe", fallback_on_error=True, metrics=METRICS)
    assert fallback.checkpoint == str(SHIPPED_FORECASTER) and "broken.onnx" in fallback.fallback_reason
    assert load_config(_flags("--model", "last_value"), env={}).model == "last_value"
    with pytest.raises(SystemExit):
        _flags("--model", "prophet")
    with pytest.raises(ValueError, match="model must be one of dprobe, last_value"):
        load_config({}, env={"DPROBE_SIDECAR_MODEL": "prophet"})
    monkeypatch.setattr(loading, "SHIPPED_FORECASTER", tmp_path / "gone.onnx")  # a damaged installation
    with pytest.raises(CheckpointError, match="gone.onnx: no such file"):
        open_forecaster(None, "dprobe")
    with caplog.at_level(logging.WARNING, logger="dprobe"):
        assert open_forecaster(None, "dprobe", fallback_on_error=True).kind == "baseline:ewma"
    assert "gone.onnx" in caplog.text


@pytest.mark.parametrize("name", ["last_value", "ewma", "moving_median", "seasonal_naive"])
def test_online_baseline_matches_the_baseline(name: str) -> None:
    rng = np.random.default_rng(3)
    y = rng.random((8, 120)).cumsum(axis=1)
    y[rng.random(y.shape) < 0.1] = np.nan
    y[2, :100] = np.nan
    y[3] = np.nan
    batch = ForecastInput(y, "gpu_memory_bytes", (1, 6, 30), 10.0)
    want = make_baseline(name).predict(batch)
    got = load_forecaster(None, name).predict(batch)
    np.testing.assert_allclose(got.point, want.point, rtol=1e-9)
    np.testing.assert_allclose(got.quantiles, want.quantiles, rtol=1e-9)


# the process ---------------------------------------------------------------------------------
def _sidecar_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "dprobe.services.sidecar", "--listen-address", "127.0.0.1", *args]


@pytest.mark.slow
def test_refuses_to_start_on_bad_checkpoint(tmp_path: Path) -> None:
    bad = tmp_path / "model.ckpt"
    bad.write_bytes(b"PK\x03\x04 truncated")
    r = subprocess.run(_sidecar_cmd("--checkpoint", str(bad), "--source", "synthetic"), cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and str(bad) in r.stderr and "cannot be read" in r.stderr


@pytest.mark.slow
def test_sigterm_stops_within_5_seconds(tmp_path: Path) -> None:
    sock_port = _free_port()
    proc = subprocess.Popen(_sidecar_cmd("--port", str(sock_port), "--source", "synthetic", "--synthetic-targets",
                                         "8", "--sample-interval", "0.2", "--step-seconds", "1",
                                         "--forecast-interval", "1"),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 45
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{sock_port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.time() < deadline, "sidecar did not become ready"
            time.sleep(0.2)
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=10)
        assert rc == 0 and time.monotonic() - t < 5
        out = proc.stdout.read()
        assert "SIGTERM" in out and "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_threads_do_not_leak() -> None:
    before = threading.active_count()
    sc = Sidecar(_fast_config(), sources=[Flaky()], model=open_forecaster(None, "last_value"))
    sc.start()
    time.sleep(0.2)
    sc.stop()
    time.sleep(0.1)
    assert threading.active_count() <= before + 1


def test_a_failure_to_follow_the_annotations_does_not_stop_the_forecasts(caplog) -> None:
    """Whatever goes wrong reading the pod's annotations, the forecast loop goes on, and says so once."""
    sc = Sidecar(_fast_config(), sources=[SyntheticSource(2)], model=open_forecaster(None, "last_value"))

    def broken() -> bool:
        raise RuntimeError("annotations file unreadable")

    sc.graphs.refresh = broken
    with caplog.at_level(logging.ERROR, logger="dprobe.services.sidecar.service"):
        sc.start(serve=False)
        try:
            deadline = time.time() + 10
            while sc.engine.cycles_total < 5:
                assert time.time() < deadline, "the forecast loop stopped"
                time.sleep(0.05)
        finally:
            sc.stop()
    assert sc.engine.snapshot is not None
    failures = [r for r in caplog.records if "pod annotations not followed" in r.getMessage()]
    assert len(failures) == 1 and "RuntimeError: annotations file unreadable" in failures[0].getMessage()


def test_a_failing_cycle_or_sink_does_not_stop_the_sidecar() -> None:
    """An unexpected error in a forecast cycle, or in storing a poll's samples, is counted, and the loops go on."""
    sc = Sidecar(_fast_config(), sources=[SyntheticSource(2)], model=open_forecaster(None, "last_value"))
    cycle, sink, calls = sc.store.drop_older_than, sc.pollers[0].sink, {"cycle": 0, "sink": 0}

    def failing(name, real):
        def call(*args):
            calls[name] += 1
            if calls[name] <= 3:
                raise KeyError("a bug")
            return real(*args)
        return call

    sc.store.drop_older_than, sc.pollers[0].sink = failing("cycle", cycle), failing("sink", sink)  # a bug there
    sc.start(serve=False)
    try:
        deadline = time.time() + 10
        while sc.engine.snapshot is None:
            assert time.time() < deadline, "no forecast after the failures"
            time.sleep(0.05)
    finally:
        sc.stop()
    assert sc.engine.errors_total >= 3 and sc.pollers[0].errors_total >= 3 and calls["sink"] > 3


def test_engine_runs_a_trained_model_checkpoint(tmp_path: Path) -> None:
    """A dprobe.pt checkpoint (trained on 57 s steps) serves a sidecar sampling every 10 s."""
    from dprobe.forecaster.checkpoint import export_checkpoint
    from dprobe.forecaster.module import ForecasterModule
    from dprobe.forecaster.tasks import TaskSpec

    module = ForecasterModule(n_tasks=2, context_length=32, d_model=16, n_heads=2, n_layers=1)
    specs = [TaskSpec("gpu_duty_cycle_pct", "alibaba-genai-2026", (5, 15, 30), 57.0, (), 4.0),
             TaskSpec("gpu_memory_bytes", "alibaba-genai-2026", (5, 15, 30), 57.0, (), 1e9)]
    path = export_checkpoint(module, specs, tmp_path / "dprobe.pt")
    loaded = open_forecaster(str(path))
    assert loaded.kind == "dprobe-forecaster" and loaded.checkpoint == str(path)
    store = WindowStore(step=10.0, length=400)
    for k in range(400):
        store.add([Sample("pod-a", 10.0 * k, 20e9, 0.25), Sample("pod-b", 10.0 * k, 5e9 + 1e6 * k, 0.5)])
    engine = ForecastEngine(store, loaded.forecaster, horizons=[60, 300, 900], stale_after=30, drop_after=60,
                            clock=lambda: 3995.0)
    snap = engine.cycle()
    assert snap is not None and snap.targets == ("pod-a", "pod-b") and engine.errors_total == 0
    mem, util = snap.quantiles["gpu_memory_bytes"], snap.quantiles["gpu_utilization_ratio"]
    assert mem.shape == util.shape == (2, 3, len(QUANTILES))
    # an untrained model forecasts the last value: the memory of pod-a, the utilisation of both
    np.testing.assert_allclose(mem[0, :, 0], 20e9, rtol=1e-6)
    assert (np.diff(mem, axis=-1) >= 0).all()
    np.testing.assert_allclose(util[:, :, 0], [[0.25] * 3, [0.5] * 3], rtol=1e-6)
    too_far = ForecastEngine(store, loaded.forecaster, horizons=[7200], stale_after=30, drop_after=60,
                             clock=lambda: 3995.0)
    assert too_far.cycle() is None and too_far.errors_total == 1  # beyond the trained leads: refused, counted


def test_window_defaults_to_what_the_forecaster_reads(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """window_seconds 0: a checkpoint's context at its step (not a fixed hour that would leave half of it
    gaps); a baseline keeps an hour; a window set shorter than the checkpoint reads is kept, with a warning."""
    from dprobe.forecaster.checkpoint import export_checkpoint
    from dprobe.forecaster.module import ForecasterModule
    from dprobe.forecaster.tasks import TaskSpec
    from dprobe.services.sidecar.service import BASELINE_WINDOW_SECONDS

    module = ForecasterModule(n_tasks=2, context_length=32, d_model=16, n_heads=2, n_layers=1)
    specs = [TaskSpec("gpu_duty_cycle_pct", "alibaba-genai-2026", (5, 15, 30), 57.0, (), 4.0),
             TaskSpec("gpu_memory_bytes", "alibaba-genai-2026", (5, 15, 30), 120.0, (), 1e9)]
    trained = open_forecaster(str(export_checkpoint(module, specs, tmp_path / "dprobe.pt")))
    sc = Sidecar(_fast_config(window_seconds=0, step_seconds=10.0, horizons=[60]), sources=[Flaky()],
                 model=trained)
    assert sc.config.window_seconds == 32 * 120.0 and sc.store.length == 384  # the longer of the two tasks
    sc = Sidecar(_fast_config(window_seconds=0), sources=[Flaky()], model=open_forecaster(None, "last_value"))
    assert sc.config.window_seconds == BASELINE_WINDOW_SECONDS
    with caplog.at_level(logging.WARNING, logger="dprobe.services.sidecar.service"):
        sc = Sidecar(_fast_config(window_seconds=600, step_seconds=10.0, horizons=[60]), sources=[Flaky()],
                     model=trained)
    assert sc.store.length == 60 and any("shorter than the 3840 s" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="window_seconds must be positive"):
        _fast_config(window_seconds=-1).validate()


def test_a_checkpoint_for_other_metrics(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A checkpoint that forecasts only GPU memory serves memory, and utilisation is left out (not every
    cycle failing); one that forecasts neither is refused at start, or replaced by the baseline if asked."""
    from dprobe.forecaster.checkpoint import export_checkpoint
    from dprobe.forecaster.module import ForecasterModule
    from dprobe.forecaster.tasks import TaskSpec

    memory = TaskSpec("gpu_memory_bytes", "alibaba-genai-2026", (5, 15, 30), 57.0, (), 1e9)
    demand = TaskSpec("gpu_demand", "helios-earth-vc", (6, 12, 24), 300.0, (), 10.0)
    module = ForecasterModule(n_tasks=1, context_length=32, d_model=16, n_heads=2, n_layers=1)
    only_memory = export_checkpoint(module, [memory], tmp_path / "memory.pt")
    only_demand = export_checkpoint(module, [demand], tmp_path / "demand.pt")
    loaded = open_forecaster(str(only_memory), metrics=METRICS)
    store = WindowStore(step=10.0, length=100)
    for k in range(100):
        store.add([Sample("pod-a", 10.0 * k, 20e9, 0.25)])
    with caplog.at_level(logging.WARNING, logger="dprobe.services.sidecar.engine"):
        engine = ForecastEngine(store, loaded.forecaster, horizons=[60, 300], stale_after=30, drop_after=60,
                                clock=lambda: 995.0)
    assert any("does not forecast gpu_utilization_ratio" in r.getMessage() for r in caplog.records)
    snap = engine.cycle()
    assert snap is not None and engine.errors_total == 0
    np.testing.assert_allclose(snap.quantiles["gpu_memory_bytes"][0, :, 0], 20e9, rtol=1e-6)
    assert np.isnan(snap.quantiles["gpu_utilization_ratio"]).all()
    with pytest.raises(CheckpointError, match="forecasts gpu_demand, none of gpu_memory_bytes, gpu_utilization_ratio"):
        open_forecaster(str(only_demand), metrics=METRICS)
    fallback = open_forecaster(str(only_demand), "last_value", fallback_on_error=True, metrics=METRICS)
    assert fallback.kind == "baseline:last_value" and "gpu_demand" in fallback.fallback_reason
    assert open_forecaster(str(only_demand)).kind == "dprobe-forecaster"  # without metrics: as loaded
