"""Inference step time under the settings users run: channels-last and re-parameterised models, scored
on timm's inference tables (datasets/timm-infer-gpus) with each fifth of the timm modules (families) left
out, through :func:`dprobe.profiling.coldstart.settings.adjust_frame` (what ``dprobe predict --mode
inference --memory-format channels-last`` applies, on the same shipped defaults).

    .venv/bin/python benchmarks/predict_settings.py [--data datasets/timm-infer-gpus] [--json] [--write]

- **channels-last** (the RTX 3090 NHWC table, PyTorch 2.4): each row replayed channels-last; per fold the
  inference step model (the shipped method and roofline) is fitted on the other folds' channels-first rows,
  and the channels-last rows of the other folds fit the layout correction. Scored side by side: the
  channels-first prediction as a proxy (what ``dprobe predict`` gave before), the rule (one factor) and
  the model (the factor from the op-class shares); MAPE, median predicted / measured, p90 coverage.
- **re-parameterisation** (the PyTorch 2.9 tables, whose benchmark fuses models for inference): the rows
  of families with something to fuse (the tables' parameter counts are the fused models'), each predicted
  from the plain and from the fused replay by the fold's model; the PyTorch 2.4 tables' rows of the same
  families (not fused there) as the control.

``--write`` refits the layout correction on every row and writes ``default_settings.json`` (the method
that beat the other on every fold ships). Replays missing from
``replays-infer-settings.jsonl.gz`` are made first (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from dprobe.profiling.coldstart.inference import (
    SHIPPED_ROOFLINE,
    _fit,
    default_model,
    feature_frame,
    load_rows,
    predict_frame,
)
from dprobe.profiling.coldstart.settings import (
    DEFAULT_SETTINGS,
    InferenceSettings,
    LayoutCorrection,
    adjust_frame,
    choose,
    fit_layout,
    p90_ratio,
)

ROOT = Path(__file__).resolve().parents[1]
SETTINGS_REPLAYS = "replays-infer-settings.jsonl.gz"
REP_METHODS = ("fuse", "reparameterize", "switch_to_deploy")


def settings_key(model: str, batch: int, image: int, precision: str, memory_format: str, reparam: bool) -> str:
    from dprobe.profiling.coldstart.features import replay_cache_key

    return replay_cache_key(f"timm:{model}", batch, precision, "none", image, None, None, mode="inference",
                            memory_format=memory_format, reparameterize=reparam)


def build_replays(directory: Path, jobs: list[tuple[str, int, int, str, str, bool]]) -> dict[str, dict]:
    """Each job's replay from the settings' replay file, made where missing (the file rewritten)."""
    from dprobe.profiling.coldstart.features import analytical_for
    from dprobe.profiling.coldstart.timm_infer import _write, read_replays

    path = directory / SETTINGS_REPLAYS
    have = read_replays(path)
    t0, new = time.time(), 0
    for m, b, i, p, fmt, rep in jobs:
        key = settings_key(m, b, i, p, fmt, rep)
        if key in have:
            continue
        rec: dict = {"key": key, "model": m, "batch": b, "image": i, "precision": p, "memory_format": fmt,
                     "reparameterize": rep}
        try:
            est = analytical_for(f"timm:{m}", b, p, "none", image=i, mode="inference", memory_format=fmt,
                                 reparameterize=rep)
            d = est.to_dict()
            d["ops"] = [[int(o[0]), int(o[1]), int(o[2]), float(f"{o[3]:.5g}"), float(f"{o[4]:.5g}")]
                        for o in d["ops"]]
            rec["est"] = d
        except Exception as exc:  # noqa: BLE001 - a model this timm cannot build or fuse: recorded, left out
            rec["error"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
        have[key] = rec
        new += 1
        if new % 50 == 0:
            _write(path, have)
            print(f"  {new} replays made ({time.time() - t0:.0f} s)", file=sys.stderr)
    if new:
        _write(path, have)
    return have


def _est(rec: dict | None):  # noqa: ANN202 - a ReplayEstimate or None
    from dprobe.profiling.coldstart.replay import ReplayEstimate

    return ReplayEstimate.from_dict(rec["est"]) if rec and "est" in rec else None


def shipped_like(runs: pd.DataFrame, x: pd.DataFrame):  # noqa: ANN201 - an InferenceStepModel
    """The inference step model fitted on these rows, predicting as the shipped one does (its methods)."""
    shipped = default_model()
    m = _fit(runs, x, SHIPPED_ROOFLINE)
    return replace(m, method=shipped.method, seen_method=shipped.seen_method,
                   p90_factor=m.p90_factor if shipped.method == "learned" else m.rule_p90_factor)


def scores(measured: np.ndarray, p50: np.ndarray, p90: np.ndarray) -> dict[str, float]:
    return {"mape": float(100 * np.mean(np.abs(p50 - measured) / measured)),
            "median_ratio": float(np.median(p50 / measured)), "p90_coverage": float(np.mean(measured <= p90))}


def channels_last(directory: Path, runs: pd.DataFrame, ests: list, folds: list) -> tuple[dict, LayoutCorrection]:
    """The channels-last benchmark: per fold the proxy, the rule and the model; and the correction on all rows."""
    from dprobe.core.gpus import GPUS
    from dprobe.profiling.coldstart.timm_infer import family_fold, load_timm_infer

    nhwc = load_timm_infer(directory, memory_format="nhwc")
    jobs = [(r.model, int(r.batch), int(r.image), r.precision, "nhwc", False) for r in nhwc.itertuples()]
    recs = build_replays(directory, jobs)
    from dprobe.profiling.coldstart.timm_infer import REPLAYS, read_replays, replay_key

    plain = read_replays(directory / REPLAYS)
    keep, cl_ests, cf_ests = [], [], []
    for i, r in enumerate(nhwc.itertuples()):
        cl = _est(recs.get(settings_key(r.model, int(r.batch), int(r.image), r.precision, "nhwc", False)))
        cf = _est(plain.get(replay_key(r.model, int(r.batch), int(r.image), r.precision)))
        if cl is not None and cf is not None:
            keep.append(i)
            cl_ests.append(cl)
            cf_ests.append(cf)
    nhwc = nhwc.iloc[keep].reset_index(drop=True)
    specs = [GPUS[g] for g in nhwc["gpu"]]
    x_cl = feature_frame(cl_ests, list(nhwc["precision"]), specs, SHIPPED_ROOFLINE)
    x_cf = feature_frame(cf_ests, list(nhwc["precision"]), specs, SHIPPED_ROOFLINE)
    y = nhwc["step_time_s"].to_numpy(dtype=float)
    fold_of = np.array([family_fold(f) for f in nhwc["family"]])
    x_all = feature_frame(ests, list(runs["precision"]), [GPUS[g] for g in runs["gpu"]], SHIPPED_ROOFLINE)
    # each fold's channels-first model predicts every channels-last row (its own fold's held out)
    cf50 = np.full(len(nhwc), np.nan)
    cf90 = np.full(len(nhwc), np.nan)
    cl50 = np.full(len(nhwc), np.nan)
    per_fold_models = {}
    for name, train, _ in folds:
        k = int(name.split("=")[1])
        model = shipped_like(runs.iloc[train], x_all.iloc[train])
        per_fold_models[k] = model
        rows = fold_of == k
        if rows.any():
            cf50[rows], cf90[rows] = predict_frame(x_cf[rows], model=model)
            cl50[rows] = predict_frame(x_cl[rows], model=model)[0]
    out = {"rows": len(nhwc), "gpus": sorted(set(nhwc["gpu"])), "folds": []}
    lr = {"proxy": [], "rule": [], "model": []}
    pred = {k: np.full(len(nhwc), np.nan) for k in ("rule", "model")}
    for k in sorted(per_fold_models):
        test, train = fold_of == k, fold_of != k
        if not test.any():
            continue
        # the fitting rows' own channels-first predictions come from a model that saw their families: the
        # correction is fitted on those, as the shipped one is
        fit50 = predict_frame(x_cl[train], model=per_fold_models[k])[0]
        factor, intercept, coef = fit_layout(x_cl[train], y[train], fit50)
        lc = LayoutCorrection("rule", factor, intercept, list(coef), 1.0, out["gpus"], int(train.sum()))
        settings = InferenceSettings(layout=lc)
        row = {"fold": f"family={k}", "rows": int(test.sum())}
        row["proxy"] = scores(y[test], cf50[test], cf90[test])
        lr["proxy"].append(np.log(y[test] / cf50[test]))
        for method in ("rule", "model"):
            p50, p90, _, _ = adjust_frame(x_cl[test], cl50[test], cl50[test], memory_format="nhwc",
                                          settings=settings, layout_method=method)
            pred[method][test] = p50
            lr[method].append(np.log(y[test] / p50))
            row[method] = scores(y[test], p50, p50)
        out["folds"].append(row)
    for method in ("rule", "model"):
        p90 = p90_ratio(lr[method])
        for row in out["folds"]:
            test = fold_of == int(row["fold"].split("=")[1])
            row[method]["p90_coverage"] = float(np.mean(y[test] <= pred[method][test] * p90))
        out[f"{method}_p90"] = p90
    method = choose([{m: r[m]["mape"] for m in ("rule", "model")} for r in out["folds"]])
    mean = {m: float(np.mean([r[m]["mape"] for r in out["folds"]])) for m in ("proxy", "rule", "model")}
    out.update(method=method, mean_mape=mean)
    # the shipped correction: on every row, against the shipped model's channels-first predictions
    shipped50 = predict_frame(x_cl, model=default_model())[0]
    factor, intercept, coef = fit_layout(x_cl, y, shipped50)
    lc = LayoutCorrection(method, factor, intercept, [float(c) for c in coef], out[f"{method}_p90"], out["gpus"],
                          len(nhwc), cv={"mape": mean, "folds": [{"fold": r["fold"], **{m: r[m]["mape"] for m in
                                         ("proxy", "rule", "model")}} for r in out["folds"]]})
    # where the layout's effect lies: the families with the largest and smallest measured NHWC / NCHW
    return out, lc


def _training_predictions(directory: Path, fmt: str, net) -> tuple:  # noqa: ANN001
    """Each row of the table of ``fmt`` with a cached replay: measured step, the checkpoint's p50 and p90
    (through :func:`~dprobe.profiling.coldstart.job.job_inputs` and ``predict_targets``, as ``dprobe
    predict`` on the typical host), and its family."""
    from dprobe.core.gpus import GPUS
    from dprobe.profiling.coldstart.job import job_inputs
    from dprobe.profiling.coldstart.replay import ReplayEstimate
    from dprobe.profiling.coldstart.residual import predict_targets
    from dprobe.profiling.coldstart.stack import stack_of_record
    from dprobe.profiling.coldstart.timm_bench import REPLAYS, load_timm_bench, read_replays, replay_key

    bench = load_timm_bench(directory, fmt)
    st = bench.stack
    software = stack_of_record(st)
    gpu = replace(GPUS[str(st["gpu"])], memory_bytes=float(st["gpu_memory_bytes"]))
    cache = read_replays(directory / REPLAYS)
    precision, optimizer = str(st["precision"]), str(st["optimizer"])
    feats, bases, ys, fams = [], [], [], []
    for r in bench.runs.itertuples():
        rec = cache.get(replay_key(r.model, int(r.batch), int(r.image), precision, optimizer,
                                   software.attention == "fused"))
        if rec is None or "est" not in rec:
            continue
        inputs = job_inputs(f"timm:{r.model}", int(r.batch), precision, optimizer, gpu=gpu, stack=software,
                            image=int(r.image), est=ReplayEstimate.from_dict(rec["est"]))
        feats.append(inputs.feats)
        bases.append(inputs.base)
        ys.append(r.step_time_s)
        fams.append(str(r.family))
    p50, p90 = predict_targets(net, [None] * len(ys), np.array(feats), np.array(bases))
    return np.array(ys), p50[:, 3], p90[:, 3], fams


def training_channels_last(directory: Path) -> dict:
    """The RTX 3090 training table in channels-last: the shipped cold-start checkpoint's prediction as
    ``dprobe predict --gpu rtx3090`` gives it (typical host) against the rule (that prediction times the
    median measured / predicted of the other folds' channels-last rows), each fifth of the families left
    out; the channels-first table beside it. The checkpoint learnt from the channels-first rows of these
    families, so its figures are in-sample there; the rule's factor never saw the family it scores."""
    from dprobe.profiling.coldstart.checkpoint import load_checkpoint
    from dprobe.profiling.coldstart.predict import DEFAULT_CHECKPOINT
    from dprobe.profiling.coldstart.timm_infer import family_fold

    net, _ = load_checkpoint(DEFAULT_CHECKPOINT)
    out: dict = {}
    for fmt in ("nchw", "nhwc"):
        y, pred50, pred90, families = _training_predictions(directory, fmt, net)
        folds = np.array([family_fold(f) for f in families])
        rows, lr = [], []
        for k in sorted(set(folds)):
            test = folds == k
            factor = float(np.median(y[~test] / pred50[~test]))
            rule = pred50[test] * factor
            lr.append(np.log(y[test] / rule))
            rows.append({"fold": f"family={k}", "rows": int(test.sum()), "factor": factor,
                         "proxy": scores(y[test], pred50[test], pred90[test]), "rule": scores(y[test], rule, rule)})
        p90f = p90_ratio(lr)
        for r, k in zip(rows, sorted(set(folds)), strict=True):
            test = folds == k
            r["rule"]["p90_coverage"] = float(np.mean(y[test] <= pred50[test] * r["factor"] * p90f))
        out[fmt] = {"rows": len(y), "folds": rows, "rule_p90": p90f,
                    "factor": float(np.median(y / pred50)),
                    "mean_mape": {m: float(np.mean([r[m]["mape"] for r in rows])) for m in ("proxy", "rule")}}
    return out


def reparameterisation(directory: Path, runs: pd.DataFrame, ests: list, folds: list) -> dict:
    """Rows of families with something to fuse, predicted from the plain and the fused replay by the
    model of the fold that leaves their family out: the PyTorch 2.9 tables (fused there) and 2.4 (not)."""
    from dprobe.core.gpus import GPUS
    from dprobe.graph.zoo import build_module, parse_spec
    from dprobe.profiling.coldstart.timm_infer import family_fold

    fusable = {}
    for fam, models in runs.groupby("family")["model"]:
        name = sorted(set(models))[0]
        try:
            m = build_module(parse_spec(f"timm:{name}"))
        except Exception:  # noqa: BLE001
            continue
        fusable[fam] = any(hasattr(s, n) for s in m.modules() for n in REP_METHODS)
    fams = sorted(f for f, ok in fusable.items() if ok)
    sel = runs["family"].isin(fams).to_numpy()
    sub = runs[sel].reset_index(drop=True)
    sub_ests = [e for e, s in zip(ests, sel, strict=True) if s]
    jobs = [(r.model, int(r.batch), int(r.image), r.precision, "nchw", True) for r in sub.itertuples()]
    recs = build_replays(directory, jobs)
    fused = [_est(recs.get(settings_key(*j))) for j in jobs]
    ok = np.array([f is not None for f in fused])
    sub, sub_ests = sub[ok].reset_index(drop=True), [e for e, o in zip(sub_ests, ok, strict=True) if o]
    fused = [f for f in fused if f is not None]
    specs = [GPUS[g] for g in sub["gpu"]]
    x_all = feature_frame(ests, list(runs["precision"]), [GPUS[g] for g in runs["gpu"]], SHIPPED_ROOFLINE)
    x_plain = feature_frame(sub_ests, list(sub["precision"]), specs, SHIPPED_ROOFLINE)
    x_fused = feature_frame(fused, list(sub["precision"]), specs, SHIPPED_ROOFLINE)
    y = sub["step_time_s"].to_numpy(dtype=float)
    fold_of = np.array([family_fold(f) for f in sub["family"]])
    p_plain, p_fused = np.full(len(sub), np.nan), np.full(len(sub), np.nan)
    for name, train, _ in folds:
        k = int(name.split("=")[1])
        rows = fold_of == k
        if rows.any():
            model = shipped_like(runs.iloc[train], x_all.iloc[train])
            p_plain[rows] = predict_frame(x_plain[rows], model=model)[0]
            p_fused[rows] = predict_frame(x_fused[rows], model=model)[0]
    out = {"families": fams, "by_family": []}
    torch29 = sub["pytorch"].astype(str).str.startswith("2.9").to_numpy()
    for fam in fams:
        for label, rows in (("PyTorch 2.9 (fused there)", torch29), ("PyTorch 2.4 (not fused)", ~torch29)):
            r = (sub["family"].to_numpy() == fam) & rows
            if not r.any():
                continue
            params = [float(e.param_bytes) for e in np.array(fused, dtype=object)[r]]
            out["by_family"].append({"family": fam, "tables": label, "rows": int(r.sum()),
                                     "plain": scores(y[r], p_plain[r], p_plain[r]),
                                     "fused": scores(y[r], p_fused[r], p_fused[r]),
                                     "kernels_plain": float(np.mean([e.kernels for e in
                                                                     np.array(sub_ests, dtype=object)[r]])),
                                     "kernels_fused": float(np.mean([e.kernels for e in
                                                                     np.array(fused, dtype=object)[r]])),
                                     "fused_param_bytes": float(np.mean(params))})
    return out


def grouped_peak(runs: pd.DataFrame, ests: list, top: int = 12) -> dict:
    """Grouped and depthwise convolutions on the tensor cores' peak (before) or the fp32 vector peak (the
    inference roofline now, ``inference.GROUPED_TENSOR``): each row predicted by the GPU factor (what ships
    on a GPU with rows) of the fold that leaves its family out; MAPE over all rows and for the families
    with the largest share of grouped-convolution time."""
    import dprobe.profiling.coldstart.inference as inference
    from dprobe.core.gpus import GPUS

    shipped = inference.GROUPED_TENSOR
    pred = {}
    try:
        for label, flag in (("tensor", True), ("vector", False)):
            inference.GROUPED_TENSOR = flag
            pred[label] = inference.held_out_predictions(runs, ests, "family", SHIPPED_ROOFLINE)
            if label == "vector":
                x = feature_frame(ests, list(runs["precision"]), [GPUS[g] for g in runs["gpu"]], SHIPPED_ROOFLINE)
    finally:
        inference.GROUPED_TENSOR = shipped
    y = runs["step_time_s"].to_numpy(dtype=float)
    err = {k: np.abs(v["gpu_factor_p50"].to_numpy() - y) / y for k, v in pred.items()}
    ratio = {k: v["gpu_factor_p50"].to_numpy() / y for k, v in pred.items()}
    share = x["share_conv_grouped"].to_numpy()
    fams = runs["family"].to_numpy()
    by = sorted(set(fams), key=lambda f: -float(np.mean(share[fams == f])))[:top]
    return {"mape": {k: float(100 * e.mean()) for k, e in err.items()},
            "families": [{"family": f, "rows": int((fams == f).sum()), "share": float(np.mean(share[fams == f])),
                          **{k: {"mape": float(100 * err[k][fams == f].mean()),
                                 "median_ratio": float(np.median(ratio[k][fams == f]))} for k in err}}
                         for f in by]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(ROOT / "datasets" / "timm-infer-gpus"))
    p.add_argument("--train-data", default=str(ROOT / "datasets" / "timm-train-rtx3090"))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--write", action="store_true", help=f"write the fitted correction to {DEFAULT_SETTINGS.name}")
    args = p.parse_args(argv)
    from dprobe.profiling.coldstart.timm_infer import cv_folds

    t0 = time.time()
    directory = Path(args.data)
    runs, ests = load_rows(directory)
    folds = cv_folds(runs.reset_index(drop=True), by="family")
    layout, lc = channels_last(directory, runs, ests, folds)
    rep = reparameterisation(directory, runs, ests, folds)
    train = training_channels_last(Path(args.train_data))
    grouped = grouped_peak(runs, ests)
    nhwc = train["nhwc"]
    rule_everywhere = all(r["rule"]["mape"] < r["proxy"]["mape"] for r in nhwc["folds"])
    proxy_everywhere = all(r["proxy"]["mape"] < r["rule"]["mape"] for r in nhwc["folds"])
    # the checkpoint's channels-first step runs only where it beat the rule on every fold
    train_method = "proxy" if proxy_everywhere else "rule"
    fused_rows = [r for r in rep["by_family"] if r["tables"].startswith("PyTorch 2.9")]
    rep_method = "fused" if fused_rows and all(r["fused"]["mape"] < r["plain"]["mape"] for r in fused_rows) else "proxy"
    train_layout = {"method": train_method, "factor": nhwc["factor"], "p90": nhwc["rule_p90"],
                    "cv": {"mape": nhwc["mean_mape"], "rule_beat_every_fold": rule_everywhere}}
    reparam = {"method": rep_method, "cv": [{"family": r["family"], "tables": r["tables"], "plain": r["plain"]["mape"],
                                             "fused": r["fused"]["mape"]} for r in rep["by_family"]]}
    if args.write:
        InferenceSettings(layout=lc, train_layout=train_layout, reparameterize=reparam).save(DEFAULT_SETTINGS)
    report = {"channels_last": layout, "training_channels_last": train, "reparameterize": rep, "grouped": grouped,
              "seconds": time.time() - t0}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"channels-last, {layout['rows']} rows ({', '.join(layout['gpus'])}), families left out: MAPE, median "
          "predicted / measured, p90 coverage")
    print(f"{'fold':<10} {'rows':>5} | {'channels-first as proxy':<24} | {'rule (one factor)':<24} | "
          f"{'model (op-class shares)':<24}")
    for r in layout["folds"]:
        cells = [f"{r[m]['mape']:5.1f} % x{r[m]['median_ratio']:.2f} {100 * r[m]['p90_coverage']:5.1f} %"
                 for m in ("proxy", "rule", "model")]
        print(f"{r['fold']:<10} {r['rows']:>5} | " + " | ".join(f"{c:<24}" for c in cells))
    mean = layout["mean_mape"]
    print(f"{'mean':<10} {'':>5} | {mean['proxy']:5.1f} %{'':<17} | {mean['rule']:5.1f} %{'':<17} | "
          f"{mean['model']:5.1f} %")
    print(f"ships: layout-{layout['method']} (the model {'beat' if layout['method'] == 'model' else 'did not beat'} "
          "the rule on every fold)")
    print("\ntraining on the RTX 3090 (shipped cold-start checkpoint, typical host), families left out: MAPE, "
          "median predicted / measured, p90 coverage")
    for fmt, t in train.items():
        for r in t["folds"]:
            cells = [f"{r[m]['mape']:5.1f} % x{r[m]['median_ratio']:.2f} {100 * r[m]['p90_coverage']:5.1f} %"
                     for m in ("proxy", "rule")]
            print(f"{fmt:<5} {r['fold']:<10} {r['rows']:>4} | checkpoint {cells[0]:<24} | rule {cells[1]}")
        print(f"{fmt:<5} {'mean':<10} {'':>4} | checkpoint {t['mean_mape']['proxy']:5.1f} %{'':<17} | rule "
              f"{t['mean_mape']['rule']:5.1f} % (factor on all rows x{t['factor']:.3f})")
    print(f"ships for training in channels-last: {'the checkpoint' if train_method == 'proxy' else 'the rule'} "
          f"(the checkpoint {'beat' if proxy_everywhere else 'did not beat'} the rule on every fold)")
    print(f"\nre-parameterisation: families with something to fuse ({', '.join(rep['families'])}), each predicted "
          "by the fold that leaves it out: MAPE, median predicted / measured")
    for r in rep["by_family"]:
        print(f"{r['family']:<18} {r['tables']:<26} {r['rows']:>3} rows | plain {r['plain']['mape']:5.1f} % "
              f"x{r['plain']['median_ratio']:.2f} | fused {r['fused']['mape']:5.1f} % x{r['fused']['median_ratio']:.2f}"
              f" | kernels {r['kernels_plain']:.0f} -> {r['kernels_fused']:.0f}")
    print(f"ships for --reparameterize: the {'fused' if rep_method == 'fused' else 'plain'} replay's step time (the "
          f"fused replay {'beat' if rep_method == 'fused' else 'did not beat'} the plain one on every family of the "
          "fused tables); memory and kernels the fused replay's")
    print("\ngrouped / depthwise convolutions on the tensor cores' peak (before) or the fp32 vector peak (now), "
          "the GPU factor with families left out: MAPE over all rows, then the families with the most "
          f"grouped-convolution time: tensor {grouped['mape']['tensor']:.1f} % -> vector "
          f"{grouped['mape']['vector']:.1f} %")
    for r in grouped["families"]:
        print(f"{r['family']:<20} {r['rows']:>4} rows, share {r['share']:.2f} | {r['tensor']['mape']:5.1f} % "
              f"x{r['tensor']['median_ratio']:.2f} -> {r['vector']['mape']:5.1f} % x{r['vector']['median_ratio']:.2f}")
    print(f"{time.time() - t0:.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
