"""Neural graphs (dws/ng): ng-gnn and ng-transformer. The symmetry they claim (hidden-neuron
permutations) on random architectures, with a group action written here on the raw tensors (not
the model code's); controls that they are not trivially invariant; PNA's aggregation by hand; a
classifier-sized network; a training step; `zoo train` through the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

from dws.ng import NGGNN, NGTransformer, LayeredGraph
from dws.ng.aggregation import aggregate, mean_log_degree
from dws.ng.pna import GraphLayerNorm, NodeLayerNorm, PNABackbone, in_degrees
from dws.ng.relational import RTLayer
from dws.weightspace import WeightSpace
from dws_helpers import adam_losses, derange
from test_nfn import act, group_element, random_space, random_widths  # the same architectures and group action


def small_model(kind, widths, seed, **kwargs):
    torch.manual_seed(seed)
    if kind == "gnn":
        # 4 layers: a message from W_1 reaches the output neurons the readout reads through L <= 4 hops
        model = NGGNN(widths, 3, channels=8, num_layers=4, fourier_features=4, **kwargs)
    else:
        model = NGTransformer(widths, 3, edge_channels=4, node_channels=6, attention_hidden=8, node_hidden=8,
                              edge_hidden=6, head_hidden=8, heads=2, num_layers=3, fourier_features=4, **kwargs)
    return model.double().eval()


KINDS = ("gnn", "transformer")


def act_on_graph(graph: LayeredGraph, perms) -> LayeredGraph:
    """The same group element on a graph: node rows, and edge tensors as weights."""
    def edges(es):
        return None if es is None else tuple(e[:, perms[l + 1]][:, :, perms[l]] for l, e in enumerate(es))

    return LayeredGraph(tuple(x[:, p] for x, p in zip(graph.nodes, perms)), edges(graph.forward), edges(graph.backward))


def graphs_close(a: LayeredGraph, b: LayeredGraph) -> bool:
    ts = lambda g: list(g.nodes) + list(g.forward) + list(g.backward or ())  # noqa: E731
    return all(torch.allclose(x, y, atol=1e-10) for x, y in zip(ts(a), ts(b)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(5))
def test_the_models_are_invariant_to_hidden_permutations_only(kind, seed):
    gen = torch.Generator().manual_seed(300 + seed)
    widths = random_widths(gen)
    model = small_model(kind, widths, seed)
    x = random_space(widths, 4, 1, gen)
    y = model(x)
    assert y.shape == (4, 3)
    torch.testing.assert_close(model(act(x, group_element(widths, gen))), y, rtol=1e-9, atol=1e-10)
    # controls: another input, a hidden permutation of the weights of one layer only (not a group
    # element), and a permutation of the input or the output neurons change the output (by far more than
    # float64 rounding: small untrained models are nearly constant, so the margin is absolute)
    differs = lambda a, b: not torch.allclose(a, b, rtol=0, atol=1e-11)  # noqa: E731
    assert differs(model(random_space(widths, 4, 1, gen)), y)
    for end in (0, -1):
        perms = [torch.arange(d) for d in widths]
        perms[end] = derange(widths[end], gen)
        assert differs(model(act(x, perms)), y), f"neurons of layer {end} permuted"
    broken = list(x.weights)
    broken[0] = broken[0][:, derange(widths[1], gen)]  # rows of W_1 moved, b_1 and W_2 not
    assert differs(model(WeightSpace(tuple(broken), x.biases)), y)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(3))
def test_the_backbones_are_equivariant_on_nodes_and_edges(kind, seed):
    """Before the readout every node and edge state moves with the neurons it belongs to."""
    gen = torch.Generator().manual_seed(400 + seed)
    widths = random_widths(gen)
    model = small_model(kind, widths, seed)
    if kind == "gnn":
        run = lambda g: model.backbone(g)  # noqa: E731
    else:
        torch.manual_seed(seed)  # an RT layer that also updates the edges
        layer = RTLayer(6, 4, 8, 8, 6, heads=2, update_edges=True).double().eval()
        run = lambda g: layer(g, model.construct.zero_weight_edge(g.nodes[0]))  # noqa: E731
    x = random_space(widths, 3, 1, gen)
    perms = group_element(widths, gen)
    graph = model.construct(x)
    assert graphs_close(model.construct(act(x, perms)), act_on_graph(graph, perms))
    out = run(graph)
    assert graphs_close(run(act_on_graph(graph, perms)), act_on_graph(out, perms))
    assert not graphs_close(out, graph)  # it did something


@pytest.mark.parametrize("seed", range(3))
def test_the_forward_only_gnn_is_invariant_too(seed):
    gen = torch.Generator().manual_seed(500 + seed)
    widths = random_widths(gen)
    model = small_model("gnn", widths, seed, bidirectional=False)
    x = random_space(widths, 2, 1, gen)
    torch.testing.assert_close(model(act(x, group_element(widths, gen))), model(x), rtol=1e-9, atol=1e-10)
    assert model.construct(x).backward is None


@pytest.mark.parametrize("seed", range(3))
def test_the_gnn_with_node_wise_norm_is_invariant_too(seed):
    """Version 1's per-node LayerNorm (``norm="node"``) keeps the symmetry as the default per-network one does."""
    gen = torch.Generator().manual_seed(550 + seed)
    widths = random_widths(gen)
    model = small_model("gnn", widths, seed, norm="node")
    x = random_space(widths, 3, 1, gen)
    y = model(x)
    torch.testing.assert_close(model(act(x, group_element(widths, gen))), y, rtol=1e-9, atol=1e-10)
    assert not torch.allclose(small_model("gnn", widths, seed)(x), y, rtol=0, atol=1e-11)  # the norms differ


def test_graph_norm_by_hand_and_per_network():
    """One mean and variance over all neurons and channels of each network, then a per-channel affine
    map: a network's output does not depend on its batch-mates, and the nodes keep their differences."""
    gen = torch.Generator().manual_seed(7)
    nodes = [torch.randn(3, d, 5, generator=gen, dtype=torch.float64) * (l + 1) + l for l, d in enumerate((2, 4, 1))]
    norm = GraphLayerNorm(5).double()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(5, generator=gen))
        norm.bias.copy_(torch.randn(5, generator=gen))
    out = norm(nodes)
    for b in range(3):
        flat = torch.cat([x[b] for x in nodes])  # [N, C]
        mean, var = flat.mean(), flat.var(unbiased=False)
        for x, y in zip(nodes, out):
            torch.testing.assert_close(y[b], (x[b] - mean) / torch.sqrt(var + 1e-5) * norm.weight + norm.bias)
        alone = norm([x[b:b + 1] for x in nodes])
        assert all(torch.allclose(a[0], y[b]) for a, y in zip(alone, out))
    # the node-wise norm (version 1) is nn.LayerNorm on each node, with the same parameter names
    node = NodeLayerNorm(5).double()
    assert [name for name, _ in node.named_parameters()] == ["weight", "bias"] == [n for n, _ in norm.named_parameters()]
    assert all(torch.allclose(y, torch.nn.functional.layer_norm(x, (5,))) for x, y in zip(nodes, node(nodes)))
    with pytest.raises(ValueError, match="norm must be one of"):
        PNABackbone((3, 4, 2), 4, norm="batch")


def test_pna_aggregation_by_hand():
    """mean, min, max, std of each node's messages, then identity and amplification log(k + 1) / delta."""
    messages = torch.tensor([[[[1.0], [3.0], [8.0]]]])  # one node, three messages, one channel
    delta = mean_log_degree([0, 3], [2, 1])  # two nodes of degree 0, one of degree 3
    assert delta == pytest.approx(math.log(4) / 3)
    std = math.sqrt(((1 - 4) ** 2 + (3 - 4) ** 2 + (8 - 4) ** 2) / 3)
    stats = torch.tensor([4.0, 1.0, 8.0, std])
    torch.testing.assert_close(aggregate(messages, delta)[0, 0], torch.cat([stats, stats * math.log(4) / delta]))
    assert aggregate(messages[:, :, :0], delta).abs().sum() == 0  # no neighbours: zeros
    assert in_degrees((3, 4, 5, 2), bidirectional=True) == [4, 8, 6, 5]
    assert in_degrees((3, 4, 5, 2), bidirectional=False) == [0, 3, 4, 5]
    assert PNABackbone((3, 4, 2), 4).convs[0].delta == pytest.approx(mean_log_degree([4, 5, 4], [3, 4, 2]))


@pytest.mark.parametrize("kind", KINDS)
def test_a_classifier_sized_network_fits(kind):
    """784 inputs at batch 8: dense per-layer tensors, forward and backward, finite gradients."""
    torch.manual_seed(0)
    widths = (784, 32, 32, 10)
    if kind == "gnn":
        model = NGGNN(widths, 1, channels=8, fourier_features=8)
    else:
        model = NGTransformer(widths, 1, edge_channels=4, node_channels=8, attention_hidden=8, node_hidden=8,
                              edge_hidden=8, head_hidden=8, heads=2, fourier_features=8)
    ws = WeightSpace(tuple(torch.randn(8, o, i) for i, o in zip(widths[:-1], widths[1:])),
                     tuple(torch.randn(8, o) for o in widths[1:]))
    y = model(ws)
    assert y.shape == (8, 1)
    y.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.construct.positions.embedding.grad[:784].abs().sum() > 0  # every input neuron has its own


@pytest.mark.parametrize("kind", KINDS)
def test_training_steps_lower_the_loss(kind):
    """A few Adam steps fit the labels of a small batch (gradients reach every part that matters)."""
    gen = torch.Generator().manual_seed(1)
    widths = (2, 6, 1)
    torch.manual_seed(0)
    if kind == "gnn":
        model = NGGNN(widths, 3, channels=8, num_layers=2, fourier_features=4)
    else:
        model = NGTransformer(widths, 3, edge_channels=4, node_channels=8, attention_hidden=8, node_hidden=8,
                              edge_hidden=8, head_hidden=8, heads=2, num_layers=2, fourier_features=4)
    x = random_space(widths, 8, 1, gen).map(lambda t: t.float())
    labels = torch.randint(0, 3, (8,), generator=gen)
    losses = adam_losses(model, x, labels, steps=12, lr=1e-2)
    assert losses[-1] < 0.8 * losses[0], losses


def test_refusals_in_one_line(tiny_store):
    from dws.tasks.options import TrainOptions, check_options

    with pytest.raises(ValueError, match="outputs a vector"):
        check_options(TrainOptions(store=str(tiny_store), model="ng-gnn", task="adapt"))
    model = small_model("gnn", (2, 4, 1), 0)
    with pytest.raises(ValueError, match="built for networks of widths"):
        model(random_space((2, 5, 1), 1, 1, torch.Generator().manual_seed(0)))


def test_the_models_take_the_papers_width_in_proportion_to_the_channels():
    """The reference's c = 32 (98,122 / 379,594 parameters on 2-32-32-1) at the DWSNet's default 48
    channels, in proportion otherwise (even, for the transformer's 8 heads)."""
    from dws.tasks.models import build_model

    for name, cls, params in (("ng-gnn", NGGNN, 98_122), ("ng-transformer", NGTransformer, 379_594)):
        model, desc = build_model(name, (2, 32, 32, 1), 10)
        assert isinstance(model, cls) and desc["width"] == 32 and desc["params"] == params, desc
        assert desc["params"] == sum(p.numel() for p in model.parameters())
        assert build_model(name, (2, 32, 32, 1), 10, hidden_channels=96)[1]["width"] == 64
        assert build_model(name, (2, 32, 32, 1), 10, hidden_channels=16)[1]["width"] == 10
        assert build_model(name, (2, 32, 32, 1), 10, hidden_channels=1)[1]["width"] == 2


@pytest.mark.parametrize("name", ["ng-gnn", "ng-transformer"])
def test_zoo_train_runs_and_reevaluates(name, tiny_store, tmp_path):
    from cli import main
    from dws.tasks.rundir import evaluate_run

    out = tmp_path / name
    result = CliRunner().invoke(main, ["train", str(tiny_store), "--model", name, "--epochs", "2", "--lr", "1e-3",
                                       "--batch-size", "16", "--hidden-channels", "2", "--num-layers", "1",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["model"]["model"] == name
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["history"][0]) == 2
    again = evaluate_run(out, tiny_store)
    assert again["accuracy"] == pytest.approx(metrics["test"][0]["accuracy"], abs=1e-6)


def test_an_ng_gnn_run_of_version_1_evaluates_as_it_was_trained(tiny_store, tmp_path, monkeypatch):
    """Version 1 (the node-wise norm) is still built exactly for its runs (dws.tasks.models.EARLIER_VERSIONS):
    `zoo eval` reproduces what such a run recorded, without a note; a version it cannot rebuild gets one."""
    import dws.tasks.models as models
    import dws.tasks.prepare as prepare
    from dws.tasks.options import MODEL_VERSIONS, TrainOptions
    from dws.tasks.rundir import evaluate_run, load_run
    from dws.tasks.run import train_run

    with monkeypatch.context() as m:  # train as version 1's code did
        m.setitem(MODEL_VERSIONS, "ng-gnn", 1)
        m.setattr(prepare, "build_model", lambda *a, **k: models.build_model(*a, **k, version=1))
        opts = TrainOptions(store=str(tiny_store), model="ng-gnn", out=str(tmp_path / "v1"), epochs=1, lr=1e-3,
                            batch_size=16, hidden_channels=2, progress=False)
        train_run(opts, log=lambda *_: None)
    assert json.loads((tmp_path / "v1" / "config.json").read_text()).get("model_version", 1) == 1
    recorded = json.loads((tmp_path / "v1" / "metrics.json").read_text())["test"][0]["loss"]
    assert isinstance(load_run(tmp_path / "v1").model.backbone.norms[0], NodeLayerNorm)
    again = evaluate_run(tmp_path / "v1", tiny_store)
    assert again["loss"] == pytest.approx(recorded, rel=1e-5) and "note" not in again
    monkeypatch.setattr(models, "EARLIER_VERSIONS", {})  # today's code only: rebuilt as version 2, said
    assert isinstance(load_run(tmp_path / "v1").model.backbone.norms[0], GraphLayerNorm)
    assert "trained as ng-gnn version 1, rebuilt as version 2" in evaluate_run(tmp_path / "v1", tiny_store)["note"]


def test_every_earlier_version_listed_is_built_as_listed():
    """An entry of EARLIER_VERSIONS claims `build_model(version=...)` rebuilds that version; each model's
    branch must pass the entry's arguments on, or an old run would silently evaluate as today's model."""
    from dws.tasks.models import EARLIER_VERSIONS, build_model

    assert EARLIER_VERSIONS
    for (name, version), changes in EARLIER_VERSIONS.items():
        old, _ = build_model(name, (2, 8, 8, 1), 10, hidden_channels=4, activation="sine", version=version)
        new, _ = build_model(name, (2, 8, 8, 1), 10, hidden_channels=4, activation="sine")
        assert repr(old) != repr(new), (name, version, changes)


def test_graph_models_default_to_batches_that_fit_a_small_machine():
    """`--batch-size` unset: 64 for the graph models (per-weight activations), 512 for the others;
    a given size is kept."""
    from dws.tasks.options import TrainOptions, model_defaults

    for model, expected in (("ng-gnn", 64), ("ng-transformer", 64), ("scalegmn-b", 64), ("dwsnet", 512)):
        assert model_defaults(TrainOptions(store="s", model=model, task="classify", batch_size=None)).batch_size == expected
    assert model_defaults(TrainOptions(store="s", model="ng-gnn", task="classify", batch_size=32)).batch_size == 32
