"""The sidecar as a node agent at density (benchmarks/sidecar_density.py): what one more pod costs is the same
at any density, so a DaemonSet's limits can be sized as a base plus a figure per pod."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_each_pod_adds_the_same_series_and_bytes_to_metrics_at_any_density(script) -> None:
    bench = script("benchmarks/sidecar_density.py")
    rows = [bench.run_size(n, cycles=2) for n in (1, 3, 9)]
    for r in rows:
        assert r["cycle_p50_ms"] > 0 and r["rss_mb"] > 0 and r["metrics_bytes"] > 0
    series = [r["metrics_series"] for r in rows]
    # linear in pods: the 6 pods from 3 to 9 add three times what the 2 from 1 to 3 add (no series per pair of
    # pods, none that grows with the count)
    per_pod = (series[1] - series[0]) / 2
    assert per_pod > 0
    assert series[2] - series[1] == pytest.approx(6 * per_pod)
    per_pod_bytes = (rows[1]["metrics_bytes"] - rows[0]["metrics_bytes"]) / 2
    assert rows[2]["metrics_bytes"] - rows[1]["metrics_bytes"] == pytest.approx(6 * per_pod_bytes, rel=0.1)
    table = bench.table(rows)
    assert table.count("\n") == len(rows) + 1 and "| 9 |" in table
