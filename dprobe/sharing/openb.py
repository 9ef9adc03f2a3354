"""Load a directory laid out like ``datasets/alibaba-openb-2023`` (Alibaba's GPU-sharing cluster trace)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dprobe.data.common import DatasetError, Range, find_file, read_csv
from dprobe.sharing.cluster import Nodes, Pods

NAME = "alibaba-openb-2023"
NODE_FILE = "openb_node_list_gpu_node"
POD_FILE = "openb_pod_list_default"


def load_openb(directory: str | Path | None = None) -> tuple[Nodes, Pods]:
    """Nodes and pods (sorted by ``creation_time``, ties by file order); a :class:`DatasetError` naming the
    file, column and row for a missing column, a non-number or a value out of range."""
    if not directory:
        from dprobe.data.registry import bundled_dir

        directory = bundled_dir(NAME, "pass its directory")
    directory = Path(directory)
    nodes_path, pods_path = find_file(directory, NODE_FILE), find_file(directory, POD_FILE)
    positive = Range(0.0, what="a number >= 0")
    n = read_csv(nodes_path, ["sn", "cpu_milli", "memory_mib", "gpu", "model"],
                 numeric=["cpu_milli", "memory_mib", "gpu"],
                 ranges={c: positive for c in ("cpu_milli", "memory_mib", "gpu")})
    p = read_csv(pods_path, ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time"],
                 numeric=["cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time"],
                 ranges={"gpu_milli": Range(0.0, 1000.0, what="a share of one GPU in milli (0-1000)"),
                         **{c: positive for c in ("cpu_milli", "memory_mib", "num_gpu", "creation_time")}})
    for path, df in ((nodes_path, n), (pods_path, p)):
        for col in df.columns:
            if df[col].dtype.kind == "f" and col not in ("gpu_spec", "scheduled_time", "deletion_time") \
                    and df[col].isna().any():
                row = int(np.flatnonzero(df[col].isna().to_numpy())[0])
                raise DatasetError(f"{path}: column {col!r} is empty in row {row + 2}")
    if n.empty or p.empty:
        raise DatasetError(f"{directory}: no {'nodes' if n.empty else 'pods'}")
    p = p.sort_values("creation_time", kind="stable", ignore_index=True)
    share = p["gpu_milli"].to_numpy(np.float64) / 1000.0
    num = p["num_gpu"].to_numpy(np.int64)
    share = np.where(num == 0, 0.0, np.where(num > 1, 1.0, share))
    spec = p["gpu_spec"].fillna("").astype(str).tolist() if "gpu_spec" in p else []
    nodes = Nodes(names=n["sn"].astype(str).tolist(), gpus=n["gpu"].to_numpy(np.int64),
                  cpu=n["cpu_milli"].to_numpy(np.float64), memory=n["memory_mib"].to_numpy(np.float64),
                  model=n["model"].astype(str).tolist())
    pods = Pods(names=p["name"].astype(str).tolist(), num_gpu=num, share=share,
                cpu=p["cpu_milli"].to_numpy(np.float64), memory=p["memory_mib"].to_numpy(np.float64),
                gpu_spec=spec)
    return nodes, pods
