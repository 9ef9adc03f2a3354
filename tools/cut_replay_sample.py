"""Write the replay sample that ships in the wheel: a few pods of the bundled alibaba-genai-2026 data set, in its
own layout, with its licence (CC BY 4.0) and a note of what was cut.

``pip install dprobe`` carries no ``datasets/``; ``dprobe sidecar`` without a GPU replays this sample instead
(:func:`dprobe.data.registry.find_data_dir`). The pods kept are the ones with the most readings of both GPU
metrics (ties by id), so the sample is the same on every run of this script.

    python tools/cut_replay_sample.py [--pods 8] [--source datasets/alibaba-genai-2026] [--out DIR]
"""

from __future__ import annotations

import argparse
import gzip
import io
import shutil
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
NAME = "alibaba-genai-2026"
FILES = ("pod_gpu_duty_cycle_anon", "pod_gpu_memory_used_bytes_anon")
QPS = "qps"

NOTICE = """# Replay sample of alibaba-genai-2026

What `dprobe sidecar` replays when neither `$DPROBE_DATA_DIR` nor `./datasets` holds the full data set (a
machine without a GPU, dprobe installed from the package). It is a cut of the bundled data set
`datasets/{name}` (see its `CARD.md`), in the same layout:

- **Source**: Alibaba's *cluster-trace-v2026-GenAI*, published by the Alibaba Cluster Trace Program
  (`alibaba/clusterdata` on GitHub). Credit: Alibaba.
- **Licence**: Creative Commons Attribution 4.0 International (CC BY 4.0), full text in `LICENSE`.
- **Changes**: only {pods} of the data set's pods are kept (those with the most readings of both GPU
  metrics), all of their rows, and the cluster-wide API request rows of `qps`; nothing else is altered.
  Written by `tools/cut_replay_sample.py`.

For training and evaluation use the full data set (`datasets/` of dprobe's repository, or `$DPROBE_DATA_DIR`).
"""


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype={"container_ip": "string"}, keep_default_na=False, na_values={"value": [""]})


def _write(frame: pd.DataFrame, path: Path) -> None:
    """A gzip file without a timestamp in its header, so that the same rows give the same bytes."""
    text = frame.to_csv(index=False).encode()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(text)
    path.write_bytes(buf.getvalue())


def cut(source: Path, out: Path, pods: int) -> list[str]:
    """Write the sample of ``pods`` pods of ``source`` to ``out``; returns the pods kept."""
    frames = {stem: _read(source / f"{stem}.csv.gz") for stem in FILES}
    counts = [f.groupby("container_ip")["value"].count() for f in frames.values()]
    both = pd.concat(counts, axis=1, join="inner").min(axis=1)
    keep = sorted(both.sort_index().sort_values(ascending=False, kind="stable").index[:pods])
    out.mkdir(parents=True, exist_ok=True)
    for stem, frame in frames.items():
        _write(frame[frame["container_ip"].isin(keep)], out / f"{stem}.csv.gz")
    if (source / f"{QPS}.csv.gz").is_file():
        qps = _read(source / f"{QPS}.csv.gz")
        _write(qps[qps["container_ip"].isin(keep) | (qps["container_ip"] == "")], out / f"{QPS}.csv.gz")
    shutil.copyfile(source / "LICENSE", out / "LICENSE")
    (out / "NOTICE.md").write_text(NOTICE.format(name=NAME, pods=len(keep)))
    return keep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=8, help="pods kept (default 8)")
    parser.add_argument("--source", type=Path, default=REPO / "datasets" / NAME)
    parser.add_argument("--out", type=Path, default=REPO / "dprobe" / "data" / "samples" / NAME)
    args = parser.parse_args()
    keep = cut(args.source, args.out, args.pods)
    size = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"{args.out}: {len(keep)} pods, {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
