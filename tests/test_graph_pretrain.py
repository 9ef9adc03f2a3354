"""The graph corpus, the encoder's pretraining and the pretrained encoder on bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch

import dprobe.pretrain.corpus as corpus
from dprobe.graph.embed import PretrainedGraphEncoder, default_encoder_path, prepare_graph
from dprobe.graph.encoder import GraphEncoder, graph_to_data
from dprobe.graph.schema import GraphNode, ModelGraph
from dprobe.pretrain.encoder import (
    TARGETS,
    cross_probe,
    family_folds,
    fit_encoder,
    item_targets,
    ridge_probe,
    save_encoder,
)

RNN = "module:dprobe.pretrain.corpus:recurrent_tagger"


def chain_graph(n: int, kind: str = "linear") -> ModelGraph:
    nodes = [GraphNode(id=i, name=f"n{i}", kind=kind, op=kind, shapes=[[4, 64 * (1 + i % 3)]], dtypes=["float32"],
                       params=100 * i, param_bytes=400 * i, flops=1e6 * i, saved_bytes=256 * i) for i in range(n)]
    return ModelGraph(name=f"chain{n}", source="test", nodes=nodes, edges=[(i, i + 1) for i in range(n - 1)],
                      inputs={"batch": 4})


def synthetic_item(n: int, family: str) -> dict:
    """A corpus item whose labels grow with the graph's size (what the encoder can read from the graph)."""
    g = chain_graph(n)
    d = graph_to_data(g)
    labels = {"peak_per_sample_fp32": 1e6 * n, "peak_per_sample_bf16": 6e5 * n, "saved_per_sample": 1e5 * n,
              "flops_per_sample": 1e8 * n, "bytes_moved_per_sample": 1e7 * n, "kernels": 3.0 * n,
              "param_bytes": 4e4 * n, "flops_share": [0.2, 0.1, 0.7, 0, 0, 0], "moved_share": [0.5, 0.2, 0.3, 0, 0, 0]}
    from dprobe.data.workloads import graph_vector

    return {"spec": {"family": family}, "x": d.x, "kind": d.kind, "edge_index": d.edge_index,
            "edge_attr": d.edge_attr, "handmade": torch.from_numpy(graph_vector(g)), "labels": labels,
            "replay_seconds": {"fp32": 0.1, "bf16": 0.1}}


def test_gine_encoder_is_unchanged_and_gatv2_runs():
    torch.manual_seed(0)
    gine = GraphEncoder(hidden=16, out_dim=8, layers=2)
    assert "convs.0.nn.0.weight" in gine.state_dict()  # the GINE layers as before (checkpoints still load)
    batch = Batch.from_data_list([graph_to_data(chain_graph(5)), graph_to_data(chain_graph(9))])
    gat = GraphEncoder(hidden=16, out_dim=8, layers=2, conv="gatv2", heads=4)
    for enc in (gine, gat):
        z = enc(batch)
        assert z.shape == (2, 8) and torch.isfinite(z).all()
    with pytest.raises(ValueError, match="conv must be one of"):
        GraphEncoder(conv="gcn")
    with pytest.raises(ValueError, match="multiple of heads"):
        GraphEncoder(hidden=10, conv="gatv2", heads=4)


def test_corpus_item_of_a_recurrent_model_has_consistent_labels():
    spec = corpus.CorpusSpec(RNN, "module/recurrent", 2, config_kwargs={"cell": "gru", "hidden": 32, "layers": 1,
                                                                          "vocab": 100, "seq": 8})
    item = corpus.trace_item(spec)
    lab = item["labels"]
    assert item["x"].shape[0] == item["nodes"] == item["kind"].shape[0] > 3
    assert lab["peak_per_sample_fp32"] * 2 > lab["param_bytes"] > 0  # the peak holds the weights at least
    assert lab["peak_per_sample_bf16"] > 0 and lab["flops_per_sample"] > 0 and lab["kernels"] > 0
    assert sum(lab["flops_share"]) == pytest.approx(1.0) and sum(lab["moved_share"]) == pytest.approx(1.0)
    assert len(item_targets(item)) == len(TARGETS)


def test_build_corpus_lists_failures_and_resumes(tmp_path, monkeypatch):
    good = corpus.CorpusSpec(RNN, "module/recurrent", 2, config_kwargs={"cell": "lstm", "hidden": 16, "layers": 1,
                                                                          "vocab": 50, "seq": 4})
    bad = corpus.CorpusSpec("timm:no_such_model_anywhere", "timm/none", 2)
    monkeypatch.setattr(corpus, "corpus_specs", lambda per_module=3: [good, bad])
    counts = corpus.build_corpus(tmp_path, progress=False)
    assert counts == {"traced": 1, "cached": 0, "failed": 1, "failed_before": 0}
    failed = [json.loads(line) for line in (tmp_path / "failed.jsonl").read_text().splitlines()]
    assert failed[0]["model"] == bad.model and "no_such_model_anywhere" in failed[0]["reason"]
    again = corpus.build_corpus(tmp_path, progress=False)  # resumes: nothing traced twice
    assert again == {"traced": 0, "cached": 1, "failed": 0, "failed_before": 1}
    items = corpus.load_corpus(tmp_path)
    assert len(items) == 1 and items[0]["spec"]["model"] == RNN
    with pytest.raises(FileNotFoundError, match="no graph corpus"):
        corpus.load_corpus(tmp_path / "elsewhere")


def test_corpus_specs_cover_every_source():
    specs = corpus.corpus_specs(per_module=1)
    libs = {s.model.split(":")[0] for s in specs}
    assert libs == {"timm", "torchvision", "transformers", "module"}
    assert len({s.key for s in specs}) == len(specs)
    assert {s.model.split(":")[0] for s in specs[:4]} == libs  # interleaved: a --limit takes some of each


def test_family_folds_never_split_a_family():
    fams = ["a", "a", "b", "c", "c", "d", "e"]
    folds = family_folds(fams, 3, seed=0)
    assert sorted(np.concatenate(folds).tolist()) == list(range(len(fams)))
    for test in folds:
        held = {fams[i] for i in test}
        assert not held & {fams[i] for i in np.setdiff1d(np.arange(len(fams)), test)}
    with pytest.raises(ValueError, match="folds must be between 2"):
        family_folds(fams, 9, seed=0)


def test_ridge_probe_recovers_a_linear_map():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 3.0
    pred = ridge_probe(x[:40], y[:40], x[40:], alpha=1e-8)
    np.testing.assert_allclose(pred, y[40:], atol=1e-5)


@pytest.mark.slow
def test_pretraining_learns_what_the_graph_shows():
    """Labels that grow with the graph's size: the embedding's probe on held-out families beats a constant."""
    items = [synthetic_item(n, f"fam{n % 5}") for n in range(3, 33)]
    result = cross_probe(items, "gine", {"hidden": 16, "out_dim": 8, "layers": 2, "heads": 2}, folds=2, seed=0,
                         train_kw={"epochs": 30, "batch_size": 8, "precision": "fp32", "lr": 1e-2})
    truth = np.array([it["labels"]["peak_per_sample_fp32"] for it in items])
    constant = 100 * np.mean(np.abs(np.exp(np.log(truth).mean()) - truth) / truth)
    assert result.mape["peak_per_sample_fp32"]["gnn"] < constant / 2
    assert set(result.mape["peak_per_sample_bf16"]) == {"gnn", "handmade", "both", "head"}


def test_fit_encoder_rejects_bad_settings():
    items = [synthetic_item(n, "f") for n in (3, 4)]
    from dprobe.pretrain.encoder import item_data

    datas, y = [item_data(i) for i in items], np.stack([item_targets(i) for i in items])
    with pytest.raises(ValueError, match="precision must be one of"):
        fit_encoder(datas, y, {"hidden": 8, "out_dim": 4, "layers": 1}, epochs=1, precision="fp8")
    with pytest.raises(ValueError, match="batch_size and epochs"):
        fit_encoder(datas, y, {"hidden": 8, "out_dim": 4, "layers": 1}, epochs=1, batch_size=0)
    model = fit_encoder(datas, y, {"hidden": 8, "out_dim": 4, "layers": 1}, epochs=2, precision="bf16")
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_prepare_graph_counts_what_it_leaves_out():
    g = chain_graph(30)
    g.nodes[3].kind = "a_kind_from_the_future"
    p = prepare_graph(g, max_nodes=10)
    assert p.skipped_nodes == 20 and p.unknown_ops == 1
    assert p.data.num_nodes == 10 and int(p.data.edge_index.max()) < 10
    assert prepare_graph(g).skipped_nodes == 0
    with pytest.raises(ValueError, match="max_nodes"):
        prepare_graph(g, max_nodes=0)


@pytest.fixture
def tiny_encoder(tmp_path):
    from dprobe.pretrain.encoder import PretrainModel

    hp = {"hidden": 8, "out_dim": 4, "layers": 1, "heads": 2, "conv": "gine"}
    return save_encoder(PretrainModel(len(TARGETS), **hp), hp, tmp_path / "enc.pt", {"targets": TARGETS})


def test_embedding_survives_bad_input(tiny_encoder, tmp_path):
    enc = PretrainedGraphEncoder(tiny_encoder, max_nodes=12)
    big = chain_graph(40)
    big.nodes[0].kind = "never_seen"
    spec = {"model": RNN, "batch": 2, "image": None, "seq": None,
            "config_kwargs": {"cell": "gru", "hidden": 8, "layers": 1, "vocab": 20, "seq": 4}}
    out = enc.embed_specs([spec, {"model": "timm:no_such_model_anywhere", "batch": 2, "image": None, "seq": None,
                                  "config_kwargs": {}}], cache_dir=tmp_path / "graphs")
    assert out.known.tolist() == [True, False] and "no_such_model_anywhere" in out.errors[1]
    assert np.isfinite(out.z).all() and not out.z[1].any() and out.z[0].any()
    graphs = enc.embed_graphs([big, None])
    assert graphs.skipped_nodes.tolist() == [28, 0] and graphs.unknown_ops.tolist() == [1, 0]
    assert np.isfinite(graphs.z).all() and graphs.z[0].any() and graphs.errors == {1: "no graph"}


def test_checkpoint_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="pretrain_gnn"):
        PretrainedGraphEncoder(tmp_path / "missing.pt")
    torch.save({"version": "other"}, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="not a graph-encoder-v1 checkpoint"):
        PretrainedGraphEncoder(tmp_path / "old.pt")


def test_shipped_encoder_loads_and_embeds():
    assert default_encoder_path().is_file(), "dprobe/graph/pretrained_encoder.pt is shipped with the package"
    enc = PretrainedGraphEncoder()
    assert enc.meta["architectures"] >= 100 and enc.hparams["conv"] in ("gine", "gatv2")
    out = enc.embed_graphs([chain_graph(6)])
    assert out.z.shape == (1, enc.dim) and np.isfinite(out.z).all()


def test_experiment_composes_to_the_pretraining_stage(tmp_path):
    from dprobe.config import compose
    from dprobe.training import stage

    cfg = compose(["+exp=pretrain_gnn", f"paths.output_dir={tmp_path}", "trainer.fast_dev_run=true"])
    assert cfg.pretrain.enabled and not cfg.forecaster_enabled and not cfg.coldstart.enabled
    assert cfg.pretrain.fast_dev_run is True
    fn = stage(cfg.pretrain)
    assert fn.func.__name__ == "pretrain_stage" and fn.keywords["convs"] == ["gine", "gatv2"]
    assert compose([f"paths.output_dir={tmp_path}"]).get("pretrain") is None  # not in a plain run
