"""Reading one GPU's samples: dprobe's samples.csv columns, or an nvidia-smi --query-gpu log."""

from __future__ import annotations

import numpy as np
import pytest

from dprobe.data import DatasetError
from dprobe.data.gpu_samples import read_gpu_samples

SMI_HEADER = "timestamp, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n"


def test_nvidia_smi_log_with_and_without_units(tmp_path):
    path = tmp_path / "smi.csv"
    path.write_text(SMI_HEADER + "2026/12/01 05:20:00.250, 40 %, 1024 MiB, 143771 MiB\n"
                    "2026/12/01 05:20:00.050, 0 %, 512 MiB, 143771 MiB\n")  # out of order: sorted
    s = read_gpu_samples(path)
    np.testing.assert_allclose(s["t_rel"], [0.0, 0.2])
    np.testing.assert_allclose(s["gpu_util_pct"], [0, 40])
    np.testing.assert_allclose(s["mem_used_bytes"], [512 * 2**20, 1024 * 2**20])
    assert (s["mem_total_bytes"] == 143771 * 2**20).all()
    path.write_text("timestamp, utilization.gpu, memory.used, memory.total\n"  # --format=csv,nounits
                    "2026/12/01 05:20:00.000, 7, 100, 200\n2026/12/01 05:20:01.500, 9, 150, 200\n")
    s = read_gpu_samples(path)
    np.testing.assert_allclose(s["t_rel"], [0.0, 1.5])
    np.testing.assert_allclose(s["mem_used_bytes"], [100 * 2**20, 150 * 2**20])


def test_dprobe_columns(tmp_path):
    path = tmp_path / "samples.csv"
    path.write_text("t,label,gpu_util_pct,mem_used_bytes,mem_total_bytes\n12.5,r1,0,1000,5000\n12.6,r1,50,2000,5000\n")
    s = read_gpu_samples(path)
    np.testing.assert_allclose(s["t_rel"], [0.0, 0.1])
    assert list(s["mem_used_bytes"]) == [1000, 2000]


@pytest.mark.parametrize("text, match", [
    ("a,b\n1,2\n", "needs the columns t, gpu_util_pct"),
    ("timestamp, index, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n"
     "2026/12/01 05:20:00.000, 0, 1 %, 1 MiB, 2 MiB\n2026/12/01 05:20:00.000, 1, 1 %, 1 MiB, 2 MiB\n",
     "samples of 2 GPUs"),
    (SMI_HEADER + "2026/12/01 05:20:00.000, [N/A], 1 MiB, 2 MiB\n", "row 2 has a missing or non-numeric value"),
    ("t,gpu_util_pct,mem_used_bytes,mem_total_bytes\n0,150,1,2\n", "outside 0-100"),
    ("t,gpu_util_pct,mem_used_bytes,mem_total_bytes\n", "no samples"),
    ("", "not a CSV file"),
])
def test_bad_files_are_named(tmp_path, text, match):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(DatasetError, match=match):
        read_gpu_samples(path)
    with pytest.raises(DatasetError, match="no such file"):
        read_gpu_samples(tmp_path / "missing.csv")
