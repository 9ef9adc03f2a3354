#!/usr/bin/env python3
"""Compute the ``backward_window`` column of datasets/pollux-placements/models.csv from the models' graphs.

The backward window (dprobe.profiling.dataparallel.timeline) is the share of backward compute still to run
when each layer's gradient is ready, averaged over the gradient bytes. This script rebuilds each of the
five Pollux models, traces it with dprobe's graph tracer (``dprobe.graph.build.build_model_graph``, as
``dprobe predict --gpus`` does for a user's model) and prints its window beside models.csv's value, and
its parameter count beside models.csv's ``parameters``:

  imagenet     torchvision:resnet50 (224 x 224 images)
  bert         transformers:BertConfig/BertForQuestionAnswering (384 tokens)
  cifar10      ResNet-18 for CIFAR     } re-implementations in tools/pollux_models.py (no model zoo holds
  ncf          NeuMF-end               } them), with the layers and parameter counts of the training
  deepspeech2  DeepSpeech2             } code named in models.csv's ``source``

The window does not depend on the batch traced (every op's FLOPs scale with it alike).

Usage: .venv/bin/python tools/pollux_backward_window.py [--csv datasets/pollux-placements/models.csv]
                                                         [--models ncf,cifar10] [--write] [--check]
``--write`` sets the ``backward_window`` column of the CSV (3 decimals, other columns and rows kept);
``--check`` exits 1 when a value or a parameter count differs from the CSV's.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_CSV = HERE.parent / "datasets" / "pollux-placements" / "models.csv"
DECIMALS = 3  # as models.csv prints the window

# models.csv folder -> (dprobe model spec, batch traced, extra arguments of build_model_graph)
MODELS: dict[str, tuple[str, int, dict]] = {
    "imagenet": ("torchvision:resnet50", 8, {}),
    "cifar10": ("module:pollux_models:cifar_resnet18", 8, {}),
    "bert": ("transformers:BertConfig/BertForQuestionAnswering", 4, {"seq": 384}),
    "deepspeech2": ("module:pollux_models:deepspeech2", 4, {}),
    "ncf": ("module:pollux_models:neumf", 64, {}),
}


@dataclass
class Window:
    """One model's backward window and parameter count, as traced."""

    model: str
    spec: str
    window: float | None  # None: the graph has no parameters or no FLOPs
    parameters: int  # of the module (every parameter trains)

    def text(self) -> str:
        """The window as models.csv writes it (empty: none)."""
        return "" if self.window is None else f"{self.window:.{DECIMALS}f}"


def model_window(model: str) -> Window:
    """Trace one of :data:`MODELS` and compute its backward window; ValueError for an unknown name."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: one of {', '.join(MODELS)}")
    if str(HERE) not in sys.path:  # module: specs import pollux_models from this folder
        sys.path.insert(0, str(HERE))
    from dprobe.graph.build import build_model_graph
    from dprobe.profiling.dataparallel.timeline import backward_window

    spec, batch, extra = MODELS[model]
    graph = build_model_graph(spec, batch=batch, **extra)
    return Window(model, spec, backward_window(graph), int(graph.meta["params_total"]))


def read_table(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The header and rows of a models.csv; ValueError when it has no ``model`` column."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header = list(reader.fieldnames or [])
        rows = list(reader)
    if "model" not in header:
        raise ValueError(f"{path}: no 'model' column (header: {', '.join(header) or 'empty'})")
    return header, rows


def write_windows(path: Path, windows: list[Window]) -> None:
    """Set the ``backward_window`` cell of each model of ``windows`` in the CSV at ``path`` (the column is
    added when missing); other columns, rows and their order are kept. ValueError for a model it lacks."""
    header, rows = read_table(path)
    if "backward_window" not in header:
        header.append("backward_window")
    by_model = {row["model"]: row for row in rows}
    missing = [w.model for w in windows if w.model not in by_model]
    if missing:
        raise ValueError(f"{path}: no row for {', '.join(missing)}")
    for w in windows:
        by_model[w.model]["backward_window"] = w.text()
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: row.get(k) or "" for k in header} for row in rows)


def agrees(text: str | None, window: float | None) -> bool:
    """Whether a CSV cell gives ``window`` to the precision models.csv prints (both empty also agree)."""
    text = (text or "").strip()
    if window is None or not text:
        return window is None and not text
    try:
        return abs(float(text) - window) <= 0.5 * 10 ** -DECIMALS + 1e-12
    except ValueError:
        return False


def differences(windows: list[Window], rows: list[dict[str, str]]) -> list[str]:
    """What differs between traced windows and the CSV rows: a sentence per value or count."""
    by_model = {row["model"]: row for row in rows}
    found = []
    for w in windows:
        row = by_model.get(w.model)
        if row is None:
            found.append(f"{w.model}: no row in the CSV")
            continue
        if not agrees(row.get("backward_window", ""), w.window):
            exact = "" if w.window is None else f" ({w.window:.5f})"
            found.append(f"{w.model}: backward_window {w.text() or '(none)'}{exact} traced, "
                         f"{row.get('backward_window') or '(none)'} in the CSV")
        if row.get("parameters", "") != str(w.parameters):
            found.append(f"{w.model}: {w.parameters} parameters traced, {row.get('parameters') or '(none)'} "
                         "in the CSV")
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV, help="the models.csv to compare with (and --write)")
    ap.add_argument("--models", metavar="A,B", help=f"only these models (default: all of {','.join(MODELS)})")
    ap.add_argument("--write", action="store_true", help="set the CSV's backward_window column to the values")
    ap.add_argument("--check", action="store_true", help="exit 1 when a value or parameter count differs")
    args = ap.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else list(MODELS)
    unknown = [m for m in names if m not in MODELS]
    if unknown or not names:
        ap.error(f"--models: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(MODELS)}")
    try:
        _, rows = read_table(args.csv)
    except (OSError, ValueError) as exc:
        ap.error(str(exc))
    by_model = {row["model"]: row for row in rows}
    windows = []
    print(f"{'model':12s} {'window':>7s} {'csv':>7s} {'parameters':>11s} {'csv':>11s}  spec")
    for name in names:
        w = model_window(name)
        windows.append(w)
        row = by_model.get(name, {})
        print(f"{name:12s} {w.text() or '-':>7s} {row.get('backward_window') or '-':>7s} {w.parameters:11d} "
              f"{row.get('parameters') or '-':>11s}  {w.spec}", flush=True)
    found = differences(windows, rows)
    for line in found:
        print("differs:", line)
    if args.write:
        try:
            write_windows(args.csv, windows)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"wrote backward_window of {len(windows)} model(s) to {args.csv}")
    return 1 if args.check and found else 0


if __name__ == "__main__":
    sys.exit(main())
