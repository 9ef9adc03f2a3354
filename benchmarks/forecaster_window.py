"""How a trained forecaster does when it is given less history than its context.

The sidecar keeps ``window_seconds`` of history per target (by default what the checkpoint reads);
a shorter window leaves the older part of the model's input as gaps. This scores a checkpoint with
the evaluation harness on a series directory, once with full windows and once with each window cut
to its last N steps (of the data set's step), beside the 30-step moving median, and prints MAE and
pinball loss per target and lead with their ratio to the full window's.

    python benchmarks/forecaster_window.py outputs/.../dprobe.pt [--data datasets/alibaba-genai-2026]
                                           [--steps 63,32]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


class CutWindow:
    """A forecaster that sees only the last ``steps`` steps of each window (the rest as gaps)."""

    def __init__(self, model, steps: int) -> None:
        self.model, self.steps = model, steps
        self.context_length = getattr(model, "context_length", 256)
        self.name = f"last {steps} steps"

    def predict(self, batch):
        values = batch.values.copy()
        values[:, : -self.steps] = np.nan
        cov = None if batch.covariates is None else batch.covariates.copy()
        if cov is not None:
            cov[:, : -self.steps] = np.nan
        return self.model.predict(dataclasses.replace(batch, values=values, covariates=cov))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a trained dprobe.pt or dprobe.onnx")
    parser.add_argument("--data", default=str(ROOT / "datasets" / "alibaba-genai-2026"),
                        help="series directory (alibaba-genai-2026 or helios-earth-vc layout)")
    parser.add_argument("--steps", default="63,32",
                        help="window lengths to try, in steps of the data set (63 x 57 s: the one hour a "
                             "sidecar kept before it defaulted to the checkpoint's context)")
    args = parser.parse_args()
    from dprobe.data.registry import load_series_dataset
    from dprobe.evaluation.harness import EvalConfig, evaluate_dataset
    from dprobe.forecaster.loading import load_forecaster

    model = load_forecaster(args.checkpoint)
    try:
        steps = [int(s) for s in args.steps.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--steps takes comma-separated step counts, got {args.steps!r}")
    if any(s < 1 for s in steps):
        parser.error("--steps must be positive")
    models = {"full window": model, **{f"last {s} steps": CutWindow(model, s) for s in steps}}
    ds = load_series_dataset(Path(args.data))
    result = evaluate_dataset(ds, models, EvalConfig(split=model.split, baselines=("moving_median",)))
    rows = {(r["method"], r["target"], r["lead_steps"]): r for r in result.rows}
    print(f"\n{ds.name}: forecasts from windows cut short (ratio: to the full window's)")
    print(f"{'method':<22} {'target':<20} {'lead':>4} {'MAE':>10} {'ratio':>6} {'pinball':>10} {'ratio':>6}")
    for (method, target, lead), r in rows.items():
        full = rows[("full window", target, lead)]
        print(f"{method:<22} {target:<20} {lead:>4} {r['mae']:>10.4g} {r['mae'] / full['mae']:>6.2f} "
              f"{r['pinball']:>10.4g} {r['pinball'] / full['pinball']:>6.2f}")


if __name__ == "__main__":
    main()
