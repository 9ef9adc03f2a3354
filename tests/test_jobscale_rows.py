"""The job-scale rows' measured horizon and graph fields: a clear error where a job has none."""

from __future__ import annotations

import numpy as np
import pytest

from dprobe.profiling.jobscale.features import JobScaleDataset


def test_rows_without_a_horizon_or_graphs_name_what_is_missing() -> None:
    ds = JobScaleDataset(obs=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="no measured horizon"):
        ds.measured  # noqa: B018
    for name, field in (("graph_list", "graphs"), ("graph_rows", "graph_feats"),
                        ("replayed_memory", "device_estimate")):
        with pytest.raises(ValueError, match=f"no {field}: the graph variant needs"):
            getattr(ds, name)


def test_rows_with_them_give_them() -> None:
    y, feats, memory = np.ones((2, 2)), np.ones((2, 3)), np.full(2, 5.0)
    ds = JobScaleDataset(obs=np.zeros((2, 3)), y=y, graphs=["a", "b"], graph_feats=feats, device_estimate=memory)
    assert ds.measured is y and ds.graph_list == ["a", "b"] and ds.graph_rows is feats
    assert ds.replayed_memory is memory
