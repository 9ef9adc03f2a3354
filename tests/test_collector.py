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
