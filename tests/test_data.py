"""Loaders on the bundled traces, on subsets of them and on malformed copies."""

from __future__ import annotations

import gzip
import logging
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dprobe.data import (
    DatasetError,
    SeriesDataset,
    detect_dataset,
    load_alibaba,
    load_h200_profiles,
    load_helios,
    load_itp,
    load_philly,
    load_series_dataset,
)

DATASETS = Path(__file__).resolve().parents[1] / "datasets"
ALIBABA = DATASETS / "alibaba-genai-2026"
HELIOS = DATASETS / "helios-earth-vc"
H200 = DATASETS / "h200-profiles"
PHILLY = DATASETS / "philly-jobs"
ITP = DATASETS / "itp-elasticflow"
ALIBABA_FILES = ("pod_gpu_duty_cycle_anon", "pod_gpu_memory_used_bytes_anon", "qps")


# --- helpers: subsets and edited copies of the bundled files ----------------------------------------------


def write_helios_subset(dest: Path, vcs: list[str], n_rows: int | None = None, quota: bool = True) -> Path:
    """Copy some VC files (optionally only their first ``n_rows`` rows) and the quota file into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for vc in vcs:
        if n_rows is None:
            shutil.copy(HELIOS / f"{vc}.csv.gz", dest / f"{vc}.csv.gz")
        else:
            pd.read_csv(HELIOS / f"{vc}.csv.gz", nrows=n_rows).to_csv(dest / f"{vc}.csv.gz", index=False)
    if quota:
        shutil.copy(HELIOS / "Earth_gpu_number.csv", dest / "Earth_gpu_number.csv")
    return dest


def write_alibaba_subset(dest: Path, pods: list[str]) -> Path:
    """The three Alibaba files restricted to ``pods`` (cluster-wide qps rows, without a pod, are kept)."""
    dest.mkdir(parents=True, exist_ok=True)
    for stem in ALIBABA_FILES:
        df = pd.read_csv(ALIBABA / f"{stem}.csv.gz")
        keep = df["container_ip"].isin(pods) | (df["container_ip"].isna() if stem == "qps" else False)
        df[keep].to_csv(dest / f"{stem}.csv.gz", index=False)
    return dest


def longest_pods(n: int) -> list[str]:
    """The ``n`` pods with the most duty-cycle rows in the bundled trace."""
    duty = pd.read_csv(ALIBABA / "pod_gpu_duty_cycle_anon.csv.gz", usecols=["container_ip"])
    return duty["container_ip"].value_counts().index[:n].tolist()


def helios_vcs() -> list[str]:
    return sorted(p.name.split(".")[0] for p in HELIOS.glob("vc*.csv.gz"))


def assert_regular(ds: SeriesDataset) -> None:
    """Sorted, no duplicate (id, ds), consecutive ds exactly ``freq`` apart, gaps only where targets are NaN."""
    f = ds.frame
    assert not f.duplicated(["unique_id", "ds"]).any()
    for _uid, g in f.groupby("unique_id"):
        steps = g["ds"].diff().dropna()
        assert (steps == ds.freq).all()
    assert f["gap"].dtype == bool
    assert f.loc[f["gap"], ds.targets].isna().all().all()


# --- bundled data -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def alibaba() -> SeriesDataset:
    return load_alibaba(ALIBABA)


@pytest.fixture(scope="module")
def helios() -> SeriesDataset:
    return load_helios(HELIOS)


def test_alibaba_shape_and_grid(alibaba: SeriesDataset) -> None:
    assert alibaba.name == "alibaba-genai-2026"
    assert alibaba.targets == ["gpu_duty_cycle_pct", "gpu_memory_bytes"]
    assert alibaba.covariates == ["qps", "qps_api"]
    assert alibaba.freq == pd.Timedelta(seconds=57)
    assert alibaba.lead_steps == (5, 15, 30)
    assert list(alibaba.frame.columns) == ["unique_id", "ds", *alibaba.targets, *alibaba.covariates, "gap"]
    pods = set()
    for stem in ALIBABA_FILES[:2]:  # a pod may appear in one metric file only
        pods |= set(pd.read_csv(ALIBABA / f"{stem}.csv.gz", usecols=["container_ip"])["container_ip"])
    assert alibaba.series_ids == sorted(pods)
    assert_regular(alibaba)
    duty = alibaba.frame["gpu_duty_cycle_pct"].dropna()
    assert duty.between(0, 100).all()  # percent
    assert (alibaba.frame["gpu_memory_bytes"].dropna() >= 0).all()


def test_alibaba_not_interpolated(alibaba: SeriesDataset) -> None:
    """Each pod has exactly as many duty-cycle values as raw timestamps; missing grid points stay NaN."""
    raw = pd.read_csv(ALIBABA / "pod_gpu_duty_cycle_anon.csv.gz")
    per_pod_raw = raw.groupby("container_ip")["timestamp_anon"].nunique()
    per_pod_loaded = alibaba.frame.groupby("unique_id")["gpu_duty_cycle_pct"].count()
    per_pod_raw = per_pod_raw.reindex(per_pod_loaded.index, fill_value=0)
    pd.testing.assert_series_equal(per_pod_loaded, per_pod_raw, check_names=False)
    # the bundled trace has holes: they are explicit gaps
    assert alibaba.frame["gap"].any()
    gaps = alibaba.frame[alibaba.frame["gap"]]
    assert gaps["gpu_duty_cycle_pct"].isna().all() and gaps["gpu_memory_bytes"].isna().all()
    # values on the grid are the raw values (one raw sample per pod and grid point)
    pod = per_pod_raw.idxmax()
    r = raw[raw["container_ip"] == pod].sort_values("timestamp_anon")
    got = alibaba.frame[alibaba.frame["unique_id"] == pod].dropna(subset=["gpu_duty_cycle_pct"])
    np.testing.assert_allclose(got["gpu_duty_cycle_pct"].to_numpy(), r["value"].to_numpy())
    np.testing.assert_array_equal(got["ds"].to_numpy(), pd.to_datetime(r["timestamp_anon"], unit="s").to_numpy())


def test_alibaba_covariates(alibaba: SeriesDataset) -> None:
    """qps: the pod's own request rate (0 without a row); qps_api: the cluster-wide rate, same for all pods."""
    f = alibaba.frame
    assert not f[["qps", "qps_api"]].isna().any().any()
    assert (f[["qps", "qps_api"]] >= 0).all().all()
    assert (f.groupby("ds")["qps_api"].nunique() == 1).all()
    qps = pd.read_csv(ALIBABA / "qps.csv.gz")
    pod_rows = qps.dropna(subset=["container_ip"])
    pod = pod_rows["container_ip"].value_counts().index[0]
    mine = pod_rows[pod_rows["container_ip"] == pod]
    ts = pd.to_datetime(mine["timestamp_anon"], unit="s")
    g = f[f["unique_id"] == pod].set_index("ds")
    inside = ts[(ts >= g.index.min()) & (ts <= g.index.max())]
    assert len(inside) > 0
    for t in inside.iloc[:20]:
        expected = mine.loc[ts == t, "value"].sum()
        assert g.loc[t, "qps"] == pytest.approx(expected)
    assert g["qps"].sum() == pytest.approx(mine.loc[inside.index, "value"].sum())
    # covariate arrays line up with the target arrays
    arrays, covs = alibaba.arrays("gpu_memory_bytes"), alibaba.covariate_arrays()
    assert list(arrays) == list(covs) == alibaba.series_ids
    assert all(covs[u].shape == (len(arrays[u]), 2) for u in arrays)
    long = alibaba.to_long("gpu_duty_cycle_pct")
    assert list(long.columns) == ["unique_id", "ds", "y", "qps", "qps_api"]
    with pytest.raises(KeyError):
        alibaba.to_long("qps")


def test_helios_shape_and_grid(helios: SeriesDataset) -> None:
    assert helios.name == "helios-earth-vc"
    assert helios.targets == ["gpu_demand"]
    assert helios.covariates == ["running_jobs", "pending_jobs", "quota_gpus"]
    assert helios.freq == pd.Timedelta(minutes=5)
    assert helios.lead_steps == (6, 12, 24)
    assert helios.season_length == 288
    assert helios.series_ids == helios_vcs()
    assert_regular(helios)
    assert (helios.frame["ds"].dt.minute % 5 == 0).all() and (helios.frame["ds"].dt.second == 0).all()
    raw = pd.read_csv(HELIOS / f"{helios_vcs()[0]}.csv.gz", usecols=["time"])
    assert len(helios.frame) == len(helios_vcs()) * len(raw) // 5  # whole days of 1-minute rows


def test_helios_gpu_demand_by_hand(helios: SeriesDataset) -> None:
    """gpu_demand = running_gpu_num + pending_gpu_num, averaged over each 5-minute bin, for one VC."""
    vc = helios_vcs()[0]
    raw = pd.read_csv(HELIOS / f"{vc}.csv.gz")
    raw["bin"] = pd.to_datetime(raw["time"]).dt.floor("5min")
    raw["demand"] = raw["running_gpu_num"] + raw["pending_gpu_num"]
    expected = raw.groupby("bin").agg(demand=("demand", "mean"), running=("running_job_num", "mean"),
                                      pending=("pending_job_num", "mean"))
    got = helios.frame[helios.frame["unique_id"] == vc].set_index("ds")
    assert list(got.index) == list(expected.index)
    np.testing.assert_allclose(got["gpu_demand"].to_numpy(), expected["demand"].to_numpy())
    np.testing.assert_allclose(got["running_jobs"].to_numpy(), expected["running"].to_numpy())
    np.testing.assert_allclose(got["pending_jobs"].to_numpy(), expected["pending"].to_numpy())
    # the first bin by hand: mean of rows 00:00..00:04
    first = raw.iloc[:5]
    assert got["gpu_demand"].iloc[0] == pytest.approx((first["running_gpu_num"] + first["pending_gpu_num"]).mean())
    # quota by day from Earth_gpu_number.csv
    quota = pd.read_csv(HELIOS / "Earth_gpu_number.csv", parse_dates=["date"]).set_index("date")[vc]
    day = got.index[len(got) // 2].floor("D")
    assert (got.loc[got.index.floor("D") == day, "quota_gpus"] == quota.loc[day]).all()


def test_h200_profiles() -> None:
    p = load_h200_profiles(H200)
    runs = p.runs
    assert runs["run_id"].is_unique
    assert set(runs["kind"]) <= {"train", "serve", "colocated"}
    assert len(p.train_runs()) == ((runs["kind"] == "train") & (runs["status"] == "ok")).sum() > 0
    assert len(p.train_runs(ok_only=False)) == (runs["kind"] == "train").sum()
    assert all(isinstance(k, dict) for k in runs["config_kwargs"])
    vision = runs["lib"].isin(["torchvision", "timm"])
    assert (runs.loc[vision, "image"] > 0).all()  # 224 where the CSV leaves it empty
    assert (runs["peak_reserved_bytes"] >= runs["peak_alloc_bytes"]).all()
    for col in ("batch", "params", "peak_alloc_bytes", "nvml_peak_used_bytes", "t_begin", "t_end"):
        assert pd.api.types.is_numeric_dtype(runs[col]), col
    # samples: 10 Hz NVML, labels are runs (or idle / the co-located pair)
    s = p.samples
    assert {"collection", "t", "label", "gpu_util_pct", "mem_used_bytes"} <= set(s.columns)
    assert s["gpu_util_pct"].between(0, 100).all()
    assert (s["mem_used_bytes"] <= s["mem_total_bytes"]).all()
    dt = s.sort_values(["collection", "t"]).groupby("collection")["t"].diff().dropna()
    assert dt.median() == pytest.approx(0.1, abs=0.02)
    # steps: every run id is a run; steps of a run are ordered
    assert set(p.steps["run_id"]) <= set(runs["run_id"])
    assert set(p.steps["phase"]) <= {"warmup", "train", "eval", "serve"}
    rid = p.train_runs()["run_id"].iloc[0]
    steps = p.run_steps(rid)
    assert len(steps) > 3 and steps["step"].is_monotonic_increasing
    samples = p.run_samples(rid)
    assert len(samples) > 0 and samples["t_rel"].iloc[0] == 0 and samples["t_rel"].is_monotonic_increasing
    with pytest.raises(KeyError):
        p.run_samples("no-such-run")


def test_h200_utilisation_over_the_measured_steps(tmp_path: Path) -> None:
    p = load_h200_profiles(H200)
    runs = p.train_runs()
    util = runs["gpu_util_pct_steps"]
    assert util.between(0, 100).all() and util.notna().all()
    # the step window's mean, recomputed for one run from its samples and steps
    row = runs.iloc[0]
    steps = p.run_steps(row["run_id"])
    steps = steps[steps["phase"] != "warmup"]
    s = p.run_samples(row["run_id"])
    inside = s[(s["t"] >= steps["t_start"].min()) & (s["t"] <= steps["t_end"].max())]
    assert util.iloc[0] == pytest.approx(inside["gpu_util_pct"].mean())
    # runs much longer than their steps (setup before measuring) are where the whole-run figure is low
    setup = (runs["t_end"] - runs["t_begin"]) > 3 * 2.5
    gain = util[setup] - runs.loc[setup, "nvml_gpu_util_pct_mean_2nd_half"]
    assert setup.any() and (gain > 0).all() and gain.mean() > 10
    # memory while the steps ran: never above the whole run's peak, below it where setup peaked higher
    mem = runs["nvml_used_bytes_steps"]
    assert (mem <= runs["nvml_peak_used_bytes"]).all() and (mem < runs["nvml_peak_used_bytes"] - 2**29).any()
    assert mem.iloc[0] == inside["mem_used_bytes"].max()
    # a run without steps keeps runs.csv's whole-run figure
    d = tmp_path / "h200"
    shutil.copytree(H200, d)
    all_steps = pd.read_csv(d / "steps.csv")
    all_steps[all_steps["run_id"] != row["run_id"]].to_csv(d / "steps.csv", index=False)
    runs2 = load_h200_profiles(d).train_runs().set_index("run_id")
    assert runs2.loc[row["run_id"], "gpu_util_pct_steps"] == row["nvml_gpu_util_pct_mean_2nd_half"]
    assert runs2.loc[row["run_id"], "nvml_used_bytes_steps"] == row["nvml_peak_used_bytes"]


def test_philly() -> None:
    jobs = load_philly(PHILLY)
    raw = pd.read_csv(PHILLY / "philly.csv.gz")
    assert list(jobs.columns) == ["job_id", "cluster", "submit_time", "duration", "num_gpus"]
    assert len(jobs) == len(raw) and jobs["job_id"].is_unique
    assert jobs["submit_time"].min() == 0 and jobs["submit_time"].is_monotonic_increasing
    span = (pd.to_datetime(raw["timestamp"]).max() - pd.to_datetime(raw["timestamp"]).min()).total_seconds()
    assert jobs["submit_time"].max() == span
    assert (jobs["num_gpus"] >= 1).all() and jobs["num_gpus"].dtype.kind == "i"
    assert (jobs["duration"] >= 0).all()
    assert set(jobs["cluster"]) == set(raw["cluster"].astype(str))
    assert jobs["num_gpus"].sum() == raw["num_gpus"].sum()


def test_itp() -> None:
    jobs = load_itp(ITP)
    files = sorted(ITP.glob("cluster*.csv.gz"))
    assert set(jobs["cluster"]) == {f.name.split(".")[0] for f in files}
    counts = {f.name.split(".")[0]: len(pd.read_csv(f)) for f in files}
    assert jobs["cluster"].value_counts().to_dict() == counts
    assert jobs["submit_time"].is_monotonic_increasing
    assert (jobs["num_gpus"] >= 1).all() and jobs["num_gpus"].dtype.kind == "i"
    assert (jobs["duration"] >= 0).all()


# --- subsets: any pods / VCs, never a fixed set ------------------------------------------------------------


def test_helios_subset_returns_exactly_those_vcs(tmp_path: Path) -> None:
    vcs = helios_vcs()[1:4]
    ds = load_helios(write_helios_subset(tmp_path / "h", vcs, n_rows=1440))
    assert ds.series_ids == vcs
    assert len(ds.frame) == 3 * 288
    assert_regular(ds)
    assert ds.frame["quota_gpus"].notna().all()


def test_helios_unknown_vc_and_no_quota_file(tmp_path: Path) -> None:
    """A VC the quota file does not know (or no quota file at all) loads, with NaN quota."""
    d = write_helios_subset(tmp_path / "h", [], quota=True)
    pd.read_csv(HELIOS / f"{helios_vcs()[0]}.csv.gz", nrows=600).to_csv(d / "vcNEW01.csv.gz", index=False)
    ds = load_helios(d)
    assert ds.series_ids == ["vcNEW01"]
    assert ds.frame["quota_gpus"].isna().all()
    (d / "Earth_gpu_number.csv").unlink()
    assert load_helios(d).frame["quota_gpus"].isna().all()


def test_helios_quota_file_of_another_cluster(tmp_path: Path) -> None:
    """A directory of another Helios cluster names its quota file after it; two quota files are refused."""
    vc = helios_vcs()[0]
    d = write_helios_subset(tmp_path / "h", [vc], n_rows=2000, quota=True)
    expected = load_helios(d).frame["quota_gpus"]
    assert expected.notna().all()
    (d / "Earth_gpu_number.csv").rename(d / "Venus_gpu_number.csv")
    pd.testing.assert_series_equal(load_helios(d).frame["quota_gpus"], expected)
    (d / "Saturn_gpu_number.csv").write_text((d / "Venus_gpu_number.csv").read_text())
    with pytest.raises(DatasetError, match="several quota files.*Saturn_gpu_number.csv, Venus_gpu_number.csv"):
        load_helios(d)


def test_helios_gaps_are_explicit(tmp_path: Path) -> None:
    """Missing minutes: whole empty bins become NaN + gap=True; partial bins average what is there."""
    vc = helios_vcs()[0]
    d = tmp_path / "h"
    d.mkdir()
    raw = pd.read_csv(HELIOS / f"{vc}.csv.gz", nrows=1440)
    t = pd.to_datetime(raw["time"])
    hole = (t >= "2020-05-01 01:00") & (t < "2020-05-01 01:10")  # two whole bins
    part = (t >= "2020-05-01 02:00") & (t < "2020-05-01 02:03")  # three of five minutes
    raw[~(hole | part)].to_csv(d / f"{vc}.csv.gz", index=False)
    ds = load_helios(d)
    assert_regular(ds)
    f = ds.frame.set_index("ds")
    assert len(f) == 288  # the grid is complete
    for when in ("2020-05-01 01:00", "2020-05-01 01:05"):
        assert f.loc[when, "gap"] and np.isnan(f.loc[when, "gpu_demand"])
        assert np.isnan(f.loc[when, "running_jobs"])
    assert f["gap"].sum() == 2
    rest = raw[(t >= "2020-05-01 02:03") & (t < "2020-05-01 02:05")]
    expected = (rest["running_gpu_num"] + rest["pending_gpu_num"]).mean()
    assert f.loc["2020-05-01 02:00", "gpu_demand"] == pytest.approx(expected)
    assert not f.loc["2020-05-01 02:00", "gap"]


def test_alibaba_subset_returns_exactly_those_pods(tmp_path: Path) -> None:
    pods = longest_pods(4)
    ds = load_alibaba(write_alibaba_subset(tmp_path / "a", pods))
    assert ds.series_ids == sorted(pods)
    assert_regular(ds)
    assert ds.frame["qps_api"].gt(0).any()  # cluster-wide rates kept


@pytest.mark.slow
def test_load_series_dataset_on_subsets(tmp_path: Path) -> None:
    ds = load_series_dataset(write_helios_subset(tmp_path / "h", helios_vcs()[:2], n_rows=1440))
    assert ds.name == "helios-earth-vc" and len(ds.series_ids) == 2
    ds = load_series_dataset(write_alibaba_subset(tmp_path / "a", longest_pods(2)))
    assert ds.name == "alibaba-genai-2026" and len(ds.series_ids) == 2
    with pytest.raises(DatasetError, match="not series"):
        load_series_dataset(PHILLY)
    jobs = load_series_dataset(H200)  # its training runs, one series each, split by model family
    assert jobs.name == "h200-profiles" and jobs.groups is not None


# --- malformed copies --------------------------------------------------------------------------------------


def _small_helios(tmp_path: Path) -> tuple[Path, Path]:
    vc = helios_vcs()[0]
    d = write_helios_subset(tmp_path / "h", [vc], n_rows=300)
    return d, d / f"{vc}.csv.gz"


def _edit_csv(path: Path, edit) -> None:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    df = edit(df)
    df.to_csv(path, index=False)


def _set_cell(path: Path, row: int, column: str, value: str) -> None:
    """Overwrite one cell (``row`` counts data rows from 0; the file's line is ``row + 2``)."""

    def edit(df: pd.DataFrame) -> pd.DataFrame:
        df.loc[row, column] = value
        return df

    _edit_csv(path, edit)


def test_missing_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = write_alibaba_subset(tmp_path / "a", longest_pods(1))
    full = load_alibaba(d)
    # one metric file is enough; without qps the request rates are unknown (NaN), not zero
    (d / "pod_gpu_memory_used_bytes_anon.csv.gz").unlink()
    (d / "qps.csv.gz").unlink()
    with caplog.at_level(logging.WARNING):
        duty_only = load_alibaba(d)
    assert "forecasting without request rates" in caplog.text
    assert duty_only.targets == ["gpu_duty_cycle_pct"] and duty_only.covariates == ["qps", "qps_api"]
    assert duty_only.frame[["qps", "qps_api"]].isna().all().all()
    pd.testing.assert_series_equal(duty_only.frame["gpu_duty_cycle_pct"], full.frame["gpu_duty_cycle_pct"])
    (d / "pod_gpu_duty_cycle_anon.csv.gz").unlink()
    with pytest.raises(DatasetError, match="missing both pod_gpu_duty_cycle_anon.*pod_gpu_memory_used_bytes_anon"):
        load_alibaba(d)
    h = tmp_path / "h200"
    h.mkdir()
    shutil.copy(H200 / "runs.csv", h)
    shutil.copy(H200 / "samples.csv", h)
    with pytest.raises(DatasetError, match="steps.csv"):
        load_h200_profiles(h)
    with pytest.raises(DatasetError, match="vc"):
        load_helios(tmp_path / "h200")


def test_missing_column(tmp_path: Path) -> None:
    d, path = _small_helios(tmp_path)
    _edit_csv(path, lambda df: df.drop(columns="pending_gpu_num"))
    with pytest.raises(DatasetError) as err:
        load_helios(d)
    assert path.name in str(err.value) and "pending_gpu_num" in str(err.value)


def test_missing_column_alibaba(tmp_path: Path) -> None:
    d = write_alibaba_subset(tmp_path / "a", longest_pods(1))
    path = d / "qps.csv.gz"
    _edit_csv(path, lambda df: df.rename(columns={"request_type": "kind"}))
    with pytest.raises(DatasetError) as err:
        load_alibaba(d)
    assert "qps.csv.gz" in str(err.value) and "request_type" in str(err.value)


def test_non_numeric_value(tmp_path: Path) -> None:
    d, path = _small_helios(tmp_path)
    _set_cell(path, 41, "running_gpu_num", "lots")
    with pytest.raises(DatasetError) as err:
        load_helios(d)
    msg = str(err.value)
    assert path.name in msg and "running_gpu_num" in msg and "row 43" in msg and "lots" in msg
    # the reported row is the line of the file (header is line 1)
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    assert "lots" in lines[43 - 1]


def test_non_numeric_value_alibaba_and_h200(tmp_path: Path) -> None:
    d = write_alibaba_subset(tmp_path / "a", longest_pods(1))
    path = d / "pod_gpu_duty_cycle_anon.csv.gz"
    _set_cell(path, 7, "value", "oops")
    with pytest.raises(DatasetError, match=r"pod_gpu_duty_cycle_anon\.csv\.gz: column 'value'.*row 9"):
        load_alibaba(d)
    h = tmp_path / "h200"
    shutil.copytree(H200, h)
    _set_cell(h / "runs.csv", 2, "batch", "thirty-two")
    with pytest.raises(DatasetError, match=r"runs\.csv: column 'batch'.*row 4"):
        load_h200_profiles(h)


def test_bad_timestamp(tmp_path: Path) -> None:
    d, path = _small_helios(tmp_path)
    _set_cell(path, 10, "time", "yesterday-ish")
    with pytest.raises(DatasetError, match=r"column 'time'.*row 12"):
        load_helios(d)


def test_truncated_gzip(tmp_path: Path) -> None:
    d, path = _small_helios(tmp_path)
    shutil.copy(HELIOS / path.name, path)  # the full-size file
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match=path.name):
        load_helios(d)


def test_corrupt_gzip(tmp_path: Path) -> None:
    d, path = _small_helios(tmp_path)
    shutil.copy(HELIOS / path.name, path)
    data = bytearray(path.read_bytes())
    data[200:400] = bytes(200)
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=path.name):
        load_helios(d)


@pytest.mark.parametrize("content", [b"", b"time,running_gpu_num,pending_gpu_num,running_job_num,pending_job_num\n"])
def test_empty_file(tmp_path: Path, content: bytes) -> None:
    d, path = _small_helios(tmp_path)
    path.write_bytes(gzip.compress(content))
    with pytest.raises(DatasetError, match=path.name):
        load_helios(d)


def test_job_logs_malformed(tmp_path: Path) -> None:
    p = tmp_path / "philly"
    p.mkdir()
    (p / "philly.csv").write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,a\n"
        "2017-10-09 07:02:55,70.0,,70.0,b\n"
    )
    with pytest.raises(DatasetError, match=r"philly\.csv: column 'num_gpus'.*row 3"):
        load_philly(p)
    (p / "philly.csv").write_text("timestamp,duration,num_gpus,gpu_time,cluster\nnot-a-date,66.0,1,66.0,a\n")
    with pytest.raises(DatasetError, match=r"philly\.csv: column 'timestamp'.*row 2"):
        load_philly(p)
    (p / "philly.csv").write_text("timestamp,duration,gpu_time,cluster\n2017-10-09 07:01:55,66.0,66.0,a\n")
    with pytest.raises(DatasetError, match=r"philly\.csv: missing column.*num_gpus"):
        load_philly(p)
    i = tmp_path / "itp"
    i.mkdir()
    (i / "cluster01.csv").write_text("job_id,submission_time,duration,num_gpu\na,1,two,1\n")
    with pytest.raises(DatasetError, match=r"cluster01\.csv: column 'duration'.*row 2"):
        load_itp(i)
    with pytest.raises(DatasetError, match="cluster"):
        load_itp(tmp_path / "philly")


# --- detect_dataset ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("folder", "name"),
    [
        (ALIBABA, "alibaba-genai-2026"),
        (HELIOS, "helios-earth-vc"),
        (H200, "h200-profiles"),
        (PHILLY, "philly-jobs"),
        (ITP, "itp-elasticflow"),
    ],
)
def test_detect_bundled(folder: Path, name: str) -> None:
    assert detect_dataset(folder) == name
    assert detect_dataset(str(folder)) == name


def test_detect_subsets(tmp_path: Path) -> None:
    assert detect_dataset(write_helios_subset(tmp_path / "h", helios_vcs()[:1], n_rows=10)) == "helios-earth-vc"
    assert detect_dataset(write_alibaba_subset(tmp_path / "a", longest_pods(1))) == "alibaba-genai-2026"


def test_detect_unknown(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("nothing to see")
    with pytest.raises(DatasetError, match=str(tmp_path)):
        detect_dataset(tmp_path)
    missing = tmp_path / "does-not-exist"
    with pytest.raises(DatasetError, match="not a directory"):
        detect_dataset(missing)
    with pytest.raises(DatasetError, match="does-not-exist"):
        load_series_dataset(missing)


def test_job_logs_refuse_fractional_gpus_and_missing_durations(tmp_path):
    from dprobe.data import DatasetError, load_itp, load_philly

    itp = tmp_path / "itp"
    itp.mkdir()
    (itp / "cluster01.csv").write_text("job_id,submission_time,duration,num_gpu\na,0,10,1\nb,5,20,1.5\n")
    with pytest.raises(DatasetError, match=r"cluster01.csv: column 'num_gpu' must be a whole number.*row 3"):
        load_itp(itp)
    philly = tmp_path / "philly"
    philly.mkdir()
    (philly / "philly.csv").write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                                       "2017-10-09 07:01:55,,1,66.0,vc1\n")
    with pytest.raises(DatasetError, match=r"philly.csv: column 'duration' has no value at row 2"):
        load_philly(philly)


def test_helios_quota_must_be_numeric(tmp_path, small_helios_dir):
    import shutil

    from dprobe.data import DatasetError, load_helios

    d = tmp_path / "helios"
    shutil.copytree(small_helios_dir, d)
    text = (d / "Earth_gpu_number.csv").read_text().splitlines()
    cells = text[2].split(",")
    cells[1] = "lots"
    text[2] = ",".join(cells)
    (d / "Earth_gpu_number.csv").write_text("\n".join(text) + "\n")
    with pytest.raises(DatasetError, match=r"Earth_gpu_number.csv: column .* must be numeric; row 3"):
        load_helios(d)


# --- where bundled data sets are found; the sample that ships in the package --------------------------------

SAMPLE = Path(__file__).resolve().parents[1] / "dprobe" / "data" / "samples" / "alibaba-genai-2026"


@pytest.fixture
def no_data_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """As where dprobe is installed from the package: no $DPROBE_DATA_DIR, no ./datasets, no checkout."""
    from dprobe.data import registry

    monkeypatch.delenv("DPROBE_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "CHECKOUT_DATASETS", tmp_path / "no-checkout" / "datasets")
    return tmp_path


def test_data_sets_are_found_in_order_and_the_sample_only_where_asked(no_data_here: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from dprobe.data.registry import bundled_dir, find_data_dir

    with pytest.raises(FileNotFoundError, match=r"bundled data set alibaba-genai-2026 not found \(looked in "
                                                r".*datasets/alibaba-genai-2026.*\); set DPROBE_DATA_DIR or pass"):
        bundled_dir("alibaba-genai-2026")
    assert find_data_dir("alibaba-genai-2026", sample=True) == (SAMPLE, True)
    with pytest.raises(FileNotFoundError, match="helios-earth-vc not found"):  # no sample of it ships
        find_data_dir("helios-earth-vc", sample=True)
    (no_data_here / "datasets" / "alibaba-genai-2026").mkdir(parents=True)
    assert find_data_dir("alibaba-genai-2026", sample=True) == (no_data_here / "datasets" / "alibaba-genai-2026",
                                                                 False)
    monkeypatch.setenv("DPROBE_DATA_DIR", str(DATASETS))  # first, before ./datasets
    assert bundled_dir("alibaba-genai-2026") == ALIBABA


def test_the_packaged_sample_is_a_small_licensed_cut_of_the_bundled_data_set() -> None:
    """A few whole pods of alibaba-genai-2026, their rows as in the full data set, under 1 MB, with the data set's
    licence (CC BY 4.0) and a note saying where it comes from and what was cut."""
    size = sum(p.stat().st_size for p in SAMPLE.iterdir())
    assert size < 1_000_000, f"{SAMPLE}: {size} bytes"
    assert (SAMPLE / "LICENSE").read_bytes() == (ALIBABA / "LICENSE").read_bytes()
    notice = (SAMPLE / "NOTICE.md").read_text()
    assert "CC BY 4.0" in notice and "Alibaba" in notice and "Changes" in notice
    pods = sorted(load_alibaba(SAMPLE).frame["unique_id"].unique())
    assert 3 <= len(pods) <= 20
    for stem in ALIBABA_FILES[:2]:
        cut, whole = pd.read_csv(SAMPLE / f"{stem}.csv.gz"), pd.read_csv(ALIBABA / f"{stem}.csv.gz")
        kept = whole[whole["container_ip"].isin(pods)].reset_index(drop=True)
        pd.testing.assert_frame_equal(cut, kept)
        assert whole["container_ip"].nunique() > len(pods)
