"""The GPU profile collector's plan files (the collector itself needs a GPU; its --dry-run runs anywhere)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_bundled_plans_read(collector) -> None:
    for path in sorted((ROOT / "tools" / "plans").glob("*.json")):
        if path.name.startswith(("pairs", "ddp")):  # --pairs and --ddp plans: read by their own readers
            continue
        items = collector.read_plan(path)
        assert items and all(spec["lib"] in ("torchvision", "timm", "transformers") for spec, _, _ in items)


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "Expecting property name"),
    ("[]", "non-empty JSON list"),
    ('[[{"lib": "keras", "model": "x"}, [8], ["fp32"]]]', "item 0 is not"),
    ('[[{"lib": "timm", "model": "dla34"}, [0], ["fp32"]]]', "item 0 is not"),
    ('[[{"lib": "timm", "model": "dla34"}, [8], ["fp32"]], [{"lib": "timm", "model": "x"}, [8], ["int8"]]]',
     "item 1 is not"),
    ('[[{"lib": "timm", "model": "dla34", "phases": "yes"}, [8], ["fp32"]]]', "item 0 is not"),
])
def test_bad_plans_are_refused_by_item(collector, tmp_path, content, message) -> None:
    path = tmp_path / "plan.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        collector.read_plan(path)
    with pytest.raises(ValueError, match="plan.json"):  # and names the file
        collector.read_plan(path)


def test_host_description_needs_no_gpu(collector) -> None:
    cpu = collector.host_cpu()
    assert cpu["cpu_count"] >= 1 and isinstance(cpu["cpu_model"], str)
    assert collector.host_benchmark(cuda=False) == {}  # on a GPU: microseconds per launch, tested in test_gpu.py


@pytest.mark.slow
def test_a_session_records_its_memory_format_and_runs_in_it(tmp_path) -> None:
    """--memory-format nhwc: image models run channels_last; env.json and every run record say so."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "session"
    tool = ROOT / "tools" / "collect_gpu_profiles.py"
    subprocess.run([sys.executable, str(tool), "--dry-run", "--no-services", "--no-flops", "--memory-format", "nhwc"],
                   check=True, env={**os.environ, "OUT": str(out)}, capture_output=True, timeout=600)
    assert json.loads((out / "env.json").read_text())["memory_format"] == "nhwc"
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("kind") == "train"]
    assert train and all(r["memory_format"] == "nhwc" and r["status"] == "ok" for r in train)
    with pytest.raises(subprocess.CalledProcessError):  # an unknown format is refused by argparse
        subprocess.run([sys.executable, str(tool), "--dry-run", "--memory-format", "nwhc"], check=True,
                       env={**os.environ, "OUT": str(tmp_path / "x")}, capture_output=True, timeout=60)
