"""The RTX 3090 timm training benchmark: loading and checking its tables, its replay cache, the training rows it
gives, and predictions for a GPU by its figures (fits, the largest batch, an unseen GPU's wider p90)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from dprobe.profiling.coldstart.timm_bench import (
    REPLAYS,
    TimmBenchError,
    fused_attention,
    load_stack,
    load_timm_bench,
    next_batch_up,
    read_replays,
    replay_jobs,
    replay_key,
)

BENCH = Path(__file__).resolve().parents[1] / "datasets" / "timm-train-rtx3090"


def test_timm_batch_ladder() -> None:
    assert [next_batch_up(b) for b in (512, 384, 256, 192, 96, 3, 1)] == [None, 512, 384, 256, 128, 4, 2]
    assert next_batch_up(500) is None  # off the ladder


def test_the_bundled_tables_load_with_their_stack() -> None:
    nchw = load_timm_bench(BENCH)
    nhwc = load_timm_bench(BENCH, "nhwc")
    assert len(nchw.runs) == 451 and len(nhwc.runs) == 447
    stack = nchw.stack
    assert (stack["gpu"], stack["cuda"], stack["pytorch"], stack["memory_format"]) == ("rtx3090", "11.3", "1.12", "nchw")
    assert nhwc.stack["memory_format"] == "nhwc" and not fused_attention(stack)
    r = nchw.runs.set_index("model")
    # tinynet_e: 50.423 ms a step at batch 512, 106 px (its default input, not 224)
    assert r.loc["tinynet_e", "step_time_s"] == pytest.approx(0.050423)
    assert r.loc["tinynet_e", "image"] == 106 and np.isnan(r.loc["tinynet_e", "batch_up"])
    below = nchw.runs[nchw.runs["batch"] < 512]
    assert len(below) == 333 and all(next_batch_up(b) == u for b, u in zip(below["batch"], below["batch_up"],
                                                                             strict=True))
    assert nchw.runs["family"].nunique() == 29


def test_image_sizes_are_timms_defaults() -> None:
    """The benchmark ran each model at its default input (timm's pretrained config, read without weights)."""
    import timm

    runs = load_timm_bench(BENCH).runs
    same = known = 0
    for model, image in zip(runs["model"], runs["image"], strict=True):
        cfg = timm.get_pretrained_cfg(model)  # None for names timm has since renamed (old pretrained tags)
        known += cfg is not None
        same += cfg is not None and cfg.input_size[-1] == image
    assert known > 350 and same / known > 0.95


@pytest.mark.parametrize(("column", "value", "message"), [
    ("train_step_time", "-3", "column 'train_step_time', row 3"),
    ("train_batch_size", "500", "column 'train_batch_size', row 3: 500 is not on timm's batch ladder"),
    ("train_img_size", "0", "column 'train_img_size', row 3"),
    ("train_batch_size", "12.5", "column 'train_batch_size', row 3"),
])
def test_a_bad_cell_is_named(tmp_path, column, value, message) -> None:
    import pandas as pd

    shutil.copy(BENCH / "stack.json", tmp_path / "stack.json")
    table = pd.read_csv(BENCH / "train-amp-nchw-pt112-rtx3090.csv", dtype=str)
    table.loc[1, column] = value
    table.to_csv(tmp_path / "train-amp-nchw-pt112-rtx3090.csv", index=False)
    with pytest.raises(TimmBenchError, match=message):
        load_timm_bench(tmp_path)


def test_a_bad_stack_or_table_is_named(tmp_path) -> None:
    import json

    with pytest.raises(TimmBenchError, match="stack.json: cannot read"):
        load_stack(tmp_path)
    stack = json.loads((BENCH / "stack.json").read_text())
    (tmp_path / "stack.json").write_text(json.dumps({k: v for k, v in stack.items() if k != "optimizer"}))
    with pytest.raises(TimmBenchError, match="field 'optimizer' missing"):
        load_stack(tmp_path)
    (tmp_path / "stack.json").write_text(json.dumps(stack))
    with pytest.raises(TimmBenchError, match="no table for memory format 'nhwcd'"):
        load_timm_bench(tmp_path, "nhwcd")
    (tmp_path / "train-amp-nchw-pt112-rtx3090.csv").write_text("model,timm_module\nx,y\n")
    with pytest.raises(TimmBenchError, match="column 'train_step_time' missing"):
        load_timm_bench(tmp_path)


@pytest.mark.slow
def test_the_replay_cache_is_current() -> None:
    """Every job the labels need is in the bundled cache under the current replay's key (a changed replay
    changes the keys: regenerate with `python -m dprobe.profiling.coldstart.timm_bench datasets/timm-train-rtx3090`)."""
    bench = load_timm_bench(BENCH)
    replays = read_replays(BENCH / REPLAYS)
    stack = bench.stack
    keys = [replay_key(m, b, i, stack["precision"], stack["optimizer"], fused_attention(stack))
            for m, b, i in replay_jobs(bench)]
    assert len(keys) == 784 and set(keys) <= set(replays)
    failed = [r for r in replays.values() if "error" in r]
    assert len(failed) <= 0.05 * len(keys), failed[:3]


@pytest.mark.slow
def test_benchmark_rows_teach_step_time_only() -> None:
    from dprobe.profiling.coldstart.dataset import load_benchmark_dataset
    from dprobe.profiling.coldstart.model import TARGETS

    ds = load_benchmark_dataset(BENCH, progress=False)
    n = len(ds.run_ids)
    assert n >= 0.95 * 451 and set(ds.gpus) == {"rtx3090"} and len(ds.skipped) == 451 - n
    step = TARGETS.index("step_time_seconds")
    assert ds.valid[:, step].all() and not ds.valid[:, :step].any()
    assert "convnext" in ds.families and "efficientnet" in ds.families
    i = ds.models.index("convnext_tiny")
    # the roofline on the 3090's own figures: fp16 tensor peak, 936 GB/s
    assert 0.1 < ds.base[i, step] / ds.y[i, step] < 1.0


@pytest.mark.slow
def test_predict_says_whether_a_job_fits_and_the_largest_batch_that_does() -> None:
    """ResNet-50 in fp16 with SGD: a 3090 (24 GB) holds a smaller batch than an H200; at the largest batch
    the prediction fits, a tenth above it does not."""
    from dprobe.profiling.coldstart.predict import predict_job

    small = predict_job("timm:resnet50", 64, "fp16", "sgd", gpu="rtx3090", search_batch=True)
    big = predict_job("timm:resnet50", 64, "fp16", "sgd", gpu="h200", search_batch=True)
    assert small.fits == "yes" and small.gpu_seen_in_training and small.gpu_spec["sm_count"] == 82
    assert 100 < small.largest_batch < big.largest_batch
    at = predict_job("timm:resnet50", small.largest_batch, "fp16", "sgd", gpu="rtx3090", search_batch=False)
    above = predict_job("timm:resnet50", math.ceil(small.largest_batch * 1.1), "fp16", "sgd", gpu="rtx3090",
                        search_batch=False)
    assert at.fits != "no" and above.fits == "no"


@pytest.mark.slow
def test_an_unseen_gpu_is_named_and_its_p90_wider() -> None:
    from dprobe.core.gpus import GPUS, GPUSpec
    from dprobe.profiling.coldstart.predict import predict_job

    seen = predict_job("timm:resnet18", 32, "fp16", "sgd", gpu="rtx3090", search_batch=False)
    # the same figures under another name: a GPU the checkpoint never saw (its default stack is today's,
    # h200-profiles'; told the 3090's, the features are the same)
    twin = GPUSpec(**{**GPUS["rtx3090"].__dict__, "name": "lab twin"})
    unseen = predict_job("timm:resnet18", 32, "fp16", "sgd", gpu=twin, search_batch=False, stack="timm-2022")
    assert unseen.stack == seen.stack and seen.stack["preset"] == "timm-2022"
    assert unseen.gpu == "lab twin" and not unseen.gpu_seen_in_training and "gpu_seen_in_training: false" in unseen.note
    assert unseen.as_dict()["gpu_seen_in_training"] is False
    s, u = seen.step_time_seconds, unseen.step_time_seconds
    assert u.p50 == pytest.approx(s.p50) and u.p90 / u.p50 > s.p90 / s.p50
    assert np.isfinite(u.p90)


def test_the_stacks_memory_factor_gets_the_fit_labels_right() -> None:
    """Two models: 10 and 16 GiB predicted where they ran, 26 and 22 GiB one batch up, on 24 GiB: only a
    factor between 24/22 and 24/16 gets all four labels right (1 says the second fits one batch up)."""
    from dprobe.profiling.coldstart.timm_bench import fit_memory_factor

    gib = 2.0**30
    at, up = np.array([10, 16]) * gib, np.array([26, 22]) * gib
    f = fit_memory_factor(at, up, 24 * gib, 0.0)
    assert 24 / 22 < f <= 24 / 16
    assert fit_memory_factor(at, np.array([np.nan, np.nan]), 24 * gib, 0.0) <= 24 / 16  # top-batch rows only
    assert fit_memory_factor(np.array([]), np.array([]), 24 * gib, 0.0) == 1.0


@pytest.mark.slow
def test_a_gpu_held_out_in_training_sets_how_much_wider_the_p90_is() -> None:
    """Runs on a second GPU step twice as long as the roofline says where the first GPU's runs match it:
    a model fitted on either GPU alone misses the other by a factor of two, and the shift says so."""
    from dprobe.profiling.coldstart.dataset import concat_datasets, make_dataset
    from dprobe.profiling.coldstart.features import FEATURES
    from dprobe.profiling.coldstart.fit import DEFAULTS, unseen_gpu_shift

    rng = np.random.default_rng(0)
    n = 30
    feats = rng.normal(size=(2 * n, len(FEATURES)))
    base = np.abs(rng.normal(size=(2 * n, 4))) + 1.0
    base[:, 2] = 0.5
    y = base * np.exp(rng.normal(scale=0.02, size=(2 * n, 4)))
    y[:, 2] = 0.6
    y[n:, :3] = np.nan  # the second GPU: step time only
    y[n:, 3] *= 2.0
    fams = [f"f{i % 6}" for i in range(2 * n)]
    a = make_dataset([None] * n, feats[:n], base[:n], y[:n], fams[:n], [f"a{i}" for i in range(n)])
    b = make_dataset([None] * n, feats[n:], base[n:], y[n:], fams[n:], [f"b{i}" for i in range(n)],
                     gpus=["rtx3090"] * n)
    ds = concat_datasets([a, b])
    assert ds.gpus == ["h200"] * n + ["rtx3090"] * n and not ds.valid[n:, :3].any()
    hp = {**DEFAULTS, "hidden": 8, "ensemble": 2}
    shifts = unseen_gpu_shift(ds, 40, 0, hp)
    assert shifts["step_time_seconds"] > 0.25  # log 2 = 0.69 less what the p90 already allows
    assert set(shifts) == {"step_time_seconds"}  # memory and utilisation: measured on the H200 only
    assert unseen_gpu_shift(a, 5, 0, hp) == {}  # one GPU: nothing to hold out


def test_the_3090s_default_stack_is_its_rows_stack() -> None:
    """`dprobe predict --gpu rtx3090` assumes the stack every RTX 3090 training row was measured on."""
    from dprobe.profiling.coldstart.stack import default_stack, stack_of_record

    recorded = stack_of_record(load_timm_bench(BENCH).stack)
    assert recorded == default_stack("rtx3090") and recorded.preset == "timm-2022"
    assert recorded.cudnn_benchmark and recorded.attention == "unfused" and recorded.torch == "1.12"
    nhwc = stack_of_record(load_timm_bench(BENCH, "nhwc").stack)
    assert nhwc.memory_format == "nhwc" and nhwc.preset == "recorded"


def _copy_bench(out: Path, models: list[str]) -> Path:
    """A benchmark folder with ``models``' rows of the bundled NCHW table, its stack and replay cache."""
    import pandas as pd

    out.mkdir()
    for name in ("stack.json", REPLAYS):
        shutil.copy(BENCH / name, out / name)
    table = pd.read_csv(BENCH / "train-amp-nchw-pt112-rtx3090.csv")
    table[table["model"].isin(models)].to_csv(out / "train-amp-nchw-pt112-rtx3090.csv", index=False)
    return out


def _predict_cli(args: list[str]) -> dict:
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "dprobe.cli", "predict", *args, "--json"], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.slow
def test_dprobe_predict_prints_what_cross_validation_scores(small_h200_dir, tmp_path) -> None:
    """The real CLI, on training rows of both GPUs, gives what the cross-validation's path computes for
    them with the same model (the shipped one): the same features from the same stack. H200: alexnet of
    collection 1 (cudnn.benchmark on, a host factor), shufflenet with host stalls, squeezenet; RTX 3090:
    MobileNet-V2 at batch 512 (cudnn.benchmark on) and DeiT-Tiny (attention unfused, PyTorch 1.12)."""
    from dprobe.data.h200 import load_h200_profiles, run_spec
    from dprobe.profiling.coldstart.checkpoint import load_checkpoint
    from dprobe.profiling.coldstart.crossval import predict_runs
    from dprobe.profiling.coldstart.dataset import (
        concat_datasets,
        load_benchmark_dataset,
        load_dataset,
        run_stack,
    )
    from dprobe.profiling.coldstart.model import TARGETS
    from dprobe.profiling.coldstart.predict import DEFAULT_CHECKPOINT
    from dprobe.profiling.coldstart.stack import stack_of_record

    bench = _copy_bench(tmp_path / "bench", ["mobilenetv2_100", "deit_tiny_patch16_224"])
    ds = concat_datasets([load_dataset(str(small_h200_dir), tmp_path / "cache", progress=False),
                          load_benchmark_dataset(bench, progress=False)])
    net, ckpt = load_checkpoint(DEFAULT_CHECKPOINT)
    factors = {m: math.log(f) for m, f in ckpt["host_factors"].items()}
    profiles = load_h200_profiles(small_h200_dir)
    runs = profiles.train_runs().set_index("run_id")
    picks = ["r014", "r019", "r078", "rtx3090:mobilenetv2_100", "rtx3090:deit_tiny_patch16_224"]
    idx = np.array([ds.run_ids.index(r) for r in picks])
    p50, p90 = predict_runs(net, ds, idx, factors)
    bench_stack = stack_of_record(load_timm_bench(bench).stack)
    for k, rid in enumerate(picks):
        if rid.startswith("rtx3090:"):
            model = rid.split(":", 1)[1]
            row = load_timm_bench(bench).runs.set_index("model").loc[model]
            out = _predict_cli([f"timm:{model}", "--batch", str(row["batch"]), "--image", str(row["image"]),
                                "--precision", "fp16", "--optimizer", "sgd", "--gpu", "rtx3090"])
            assert out["stack"]["preset"] == "timm-2022" and out["stack"]["overrides"] == []
            assert {k2: out["stack"][k2] for k2 in bench_stack.settings()} == bench_stack.settings()
            memory = ckpt["memory_factors"]["rtx3090"]  # the CLI's factor for that GPU's stack
        else:
            row = runs.loc[rid]
            spec = run_spec({**row, "run_id": rid})
            stack = run_stack(row, profiles.env)
            args = [spec["model"], "--batch", str(spec["batch"]), "--precision", str(row["precision"]),
                    "--optimizer", str(row["optimizer"]), "--image", str(spec["image"]),
                    "--host-stall", repr(float(row["host_stall_s"])),
                    "--host-factor", repr(ckpt["host_factors"][f"collection {int(row['collection'])}"])]
            out = _predict_cli([*args, *(["--cudnn-benchmark"] if stack.cudnn_benchmark else [])])
            assert {k2: out["stack"][k2] for k2 in stack.settings()} == stack.settings()
            memory = 1.0
        for t, target in enumerate(TARGETS):
            scale = memory if t < 2 else 1.0
            for q, want in (("p50", p50[k, t]), ("p90", max(p90[k, t], p50[k, t]))):
                tol = 1e-4 if target == "gpu_utilization" else 0
                assert out[target][q] == pytest.approx(want * scale, rel=1e-4, abs=tol), (rid, target, q)
