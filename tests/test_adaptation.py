"""Domain adaptation (``zoo train --task adapt``): the batched classifier forward, the residual adapter's
equivariance and initialization, the images each network gets, and the adapted store."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from cli import main
from clf_helpers import write_cifar_like
from dws.stream.batch import weightspace_from_arrays
from dws.tasks.adaptation import ResidualAdapter, accuracies, classifier_logits, own_class_loss, tensor_statistics
from dws.tasks.domain import Corruption, Domain
from dws.tasks.models import build_model
from dws.weightspace import WeightSpace, random_group_element
from zoo.store import WeightStore
from zoo.train.mlp import get_activation, reference_network

QUIET = dict(log=lambda *_: None)
CIFAR_WIDTHS = (3072, 64, 64, 64, 64, 10)
TINY = ["--epochs", "1", "--batch-size", "4", "--lr", "1e-3", "--hidden-channels", "2", "--num-layers", "1",
        "--image-batch", "8", "--precise-bn", "0"]


def random_networks(widths, count, generator, scale=0.3) -> WeightSpace:
    return WeightSpace(tuple(torch.randn(count, o, i, generator=generator) * scale for i, o in zip(widths, widths[1:])),
                       tuple(torch.randn(count, o, generator=generator) * scale for o in widths[1:]))


@pytest.fixture(scope="module")
def adapt_run(pair_store, cifar_like, tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "adapt"
    result = CliRunner().invoke(main, ["train", str(pair_store), "--task", "adapt", "--out", str(run), *TINY])
    assert result.exit_code == 0, result.output
    return run


def test_batched_forward_equals_each_networks_sequential():
    """One batched forward of K classifiers with mixed activations, each on its own images, equals
    each network's own ``nn.Sequential``; the loss is the cross-entropy over each one's own classes."""
    gen = torch.Generator().manual_seed(0)
    widths, K, B = (12, 8, 7, 5), 4, 6
    ws = random_networks(widths, K, gen)
    x = torch.randn(K, B, widths[0], generator=gen)
    acts = ["relu", "tanh", "relu", "gelu"]
    logits = classifier_logits(ws, x, acts)
    for k in range(K):
        net = reference_network([w[k] for w in ws.weights], [b[k] for b in ws.biases], get_activation(acts[k]))
        torch.testing.assert_close(logits[k], net(x[k]), rtol=1e-5, atol=1e-5)
    classes = torch.tensor([[0, 3], [1, 2], [2, 4], [0, 4]])
    targets = torch.randint(0, 2, (K, B), generator=gen)
    expected = torch.stack([F.cross_entropy(logits[k][:, classes[k]], targets[k], reduction="none") for k in range(K)])
    torch.testing.assert_close(own_class_loss(logits, classes, targets), expected.mean())


def test_whole_adapt_map_is_equivariant():
    """Permuting a classifier's hidden neurons permutes its residual ``dv`` (normalization included)."""
    gen = torch.Generator().manual_seed(1)
    widths = (10, 6, 5, 3)
    torch.manual_seed(1)
    model, _ = build_model("dwsnet", widths, 0, hidden_channels=4, num_layers=2, input_reduction=4, equivariant=True)
    stats = {name: (torch.randn(*shape, generator=gen).numpy(), torch.rand(*shape, generator=gen).numpy() + 0.5)
             for name, shape in _shapes(widths).items()}
    model.set_statistics(stats)
    for p in model.parameters():  # away from the near-zero initialization, so that dv is not ~0
        p.data.normal_(0, 0.3, generator=gen)
    model.eval()
    ws = random_networks(widths, 3, gen)
    perms = random_group_element(widths, batch_size=3, generator=gen)
    dv, dv_of_permuted = model.delta(ws), model.delta(ws.permute(perms))
    assert dv.weights[1].abs().max() > 1e-2
    for a, b in zip(dv.permute(perms).weights + dv.permute(perms).biases, dv_of_permuted.weights + dv_of_permuted.biases):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    adapted = model(ws)
    torch.testing.assert_close(adapted.weights[0], ws.weights[0] - dv.weights[0])


def _shapes(widths):
    from zoo.store.format import parameter_shapes

    return parameter_shapes(widths)


def test_per_tensor_statistics_pool_the_entries_exactly():
    rng = np.random.default_rng(0)
    values = {name: rng.normal(2.0, 3.0, (50, *shape)) for name, shape in _shapes((4, 3, 2)).items()}
    stats = {name: (v.mean(0), v.std(0)) for name, v in values.items()}
    means, stds = tensor_statistics(stats)
    order = ["W1", "W2", "b1", "b2"]
    np.testing.assert_allclose(means, [values[n].mean() for n in order])
    np.testing.assert_allclose(stds, [values[n].std() for n in order])


@pytest.mark.parametrize("model", ["dwsnet", "mlp"])
def test_a_fresh_adapter_leaves_the_classifiers_nearly_unchanged(pair_store, model):
    """mu = 1e-3: a fresh model's dv is ~1e-3 of the weights' spread, and no accuracy moves by more
    than an image or two."""
    store = WeightStore(pair_store)
    torch.manual_seed(0)
    adapter, _ = build_model(model, CIFAR_WIDTHS, 0, hidden_channels=16, num_layers=4, input_reduction=16,
                             equivariant=True)  # the paper's model
    adapter.set_statistics(store.stats())
    adapter.eval()
    ws = weightspace_from_arrays(store.read(0, store.num_networks))
    with torch.no_grad():
        dv = adapter.delta(ws)
    for m, (d, w) in enumerate(zip(dv.weights + dv.biases, ws.weights + ws.biases)):
        assert d.abs().max() < 0.02 * adapter.scale[m] + 1e-7, m
    domain = Domain.of_store(store)
    classes = torch.tensor(store.networks.column("classes").to_pylist())
    x, labels = domain.fixed_images("test")
    acts = ["relu"] * store.num_networks
    before, after = (np.array(accuracies(v, classes, acts, x, labels)) for v in (ws, ws - dv))
    assert np.abs(after - before).max() <= 2 / 40  # ~40 test images per pair here


def test_each_network_gets_images_of_its_own_classes(pair_store):
    """With the corruption switched off, every image a network gets in a step is a training image
    of the class its target names; validation images are never drawn."""
    store = WeightStore(pair_store)
    off = Corruption(degrees=0, flip=0, brightness=0, contrast=0, saturation=0, noise=0)
    domain = Domain.of_store(store, corruption=off)
    classes = torch.tensor([[0, 3], [2, 9], [3, 5]])
    torch.manual_seed(0)
    x, targets = domain.training_images(classes, per_class=5)
    assert x.shape == (3, 10, 3072) and targets.tolist() == [[0] * 5 + [1] * 5] * 3
    clean = domain.inputs(domain.train_pixels.float() / 255)
    for k in range(3):
        for row, target in zip(x[k], targets[k]):
            nearest = (clean - row).abs().amax(1).argmin()
            assert (clean[nearest] - row).abs().max() < 1e-3
            assert domain.train_labels[nearest] == classes[k, target]


def test_fixed_corruption_is_the_same_in_every_process_and_corrupts(pair_store):
    store = WeightStore(pair_store)
    a, b = Domain.of_store(store), Domain.of_store(store)
    torch.manual_seed(123)  # the fixed sets do not depend on (or change) the global random state
    state = torch.get_rng_state()
    xa, la = a.fixed_images("test")
    assert torch.equal(torch.get_rng_state(), state)
    xb, lb = b.fixed_images("test")
    assert torch.equal(xa, xb) and torch.equal(la, lb)
    clean, _ = a.fixed_images("clean-test")
    assert (xa - clean).abs().mean() > 0.3
    assert len(a.fixed_images("val")[1]) == len(a.heldout_labels) > 0


def test_cli_train_eval_and_adapted_store(adapt_run, pair_store, tmp_path):
    """The CLI path on a tiny store: train, evaluate, and write the adapted store, which round-trips
    v - dv and reads like any classifier store."""
    metrics = json.loads((adapt_run / "metrics.json").read_text())
    assert {"accuracy", "accuracy_before", "gain"} <= set(metrics["test"][0])
    runner = CliRunner()
    result = runner.invoke(main, ["eval", str(adapt_run), str(pair_store)])
    assert result.exit_code == 0, result.output
    evaluated = json.loads(result.output)
    assert evaluated["accuracy"] == pytest.approx(metrics["test"][0]["accuracy"])

    out = tmp_path / "adapted"
    result = runner.invoke(main, ["eval", str(adapt_run), str(pair_store), "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["test"]["corrupted_accuracy"] == pytest.approx(evaluated["accuracy"], abs=1e-6)
    assert summary["test"]["corrupted_accuracy_before"] == pytest.approx(evaluated["accuracy_before"], abs=1e-6)

    from dws.tasks.rundir import load_run

    source, adapted = WeightStore(pair_store), WeightStore(out)
    v = weightspace_from_arrays(source.read(0, source.num_networks))
    with torch.no_grad():
        expected = load_run(adapt_run).model(v)
    got = weightspace_from_arrays(adapted.read(0, adapted.num_networks))
    for a, b in zip(got.weights + got.biases, expected.weights + expected.biases):
        torch.testing.assert_close(a, b)
    assert adapted.manifest["adaptation"]["run"] == str(adapt_run.resolve())
    assert adapted.manifest["splits"] == source.manifest["splits"]
    assert adapted.networks.column("classes").to_pylist() == source.networks.column("classes").to_pylist()
    info = runner.invoke(main, ["info", str(out)])
    assert info.exit_code == 0 and "adapted" in info.output
    again = runner.invoke(main, ["eval", str(adapt_run), str(pair_store), "--out", str(out)])
    assert again.exit_code == 2 and "already holds a complete store" in again.output


@pytest.mark.parametrize("options, message", [
    (["--model", "transformer"], "--task adapt needs a model whose output is a weight space"),
    (["--target", "label"], "--task adapt has no --target"),
    (["--image-batch", "0"], "--image-batch must be at least 1"),
    (["--data-root", "nowhere"], "CIFAR-10 train split not found"),
])
def test_adapt_refuses_what_cannot_train_before_writing(pair_store, tmp_path, options, message):
    run = tmp_path / "run"
    result = CliRunner().invoke(main, ["train", str(pair_store), "--task", "adapt", "--out", str(run), *TINY, *options])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output
    assert not run.exists()


def test_adapt_refuses_stores_without_classifiers_or_images(tiny_store, pair_store, tmp_path):
    run = tmp_path / "run"
    runner = CliRunner()
    result = runner.invoke(main, ["train", str(tiny_store), "--task", "adapt", "--out", str(run), *TINY])
    assert result.exit_code == 2 and "not image classifiers" in result.output, result.output
    result = runner.invoke(main, ["train", str(tiny_store), "--data-root", str(tmp_path), "--out", str(run)])
    assert result.exit_code == 2 and "--data-root is an option of --task adapt" in result.output
    wrong = write_cifar_like(tmp_path / "other", seed=5)  # other images than the store's
    result = runner.invoke(main, ["train", str(pair_store), "--task", "adapt", "--data-root", str(wrong),
                                  "--out", str(run), *TINY])
    assert result.exit_code == 2 and "is not the file the classifiers" in result.output, result.output
    assert not run.exists()


def test_only_adapt_runs_write_adapted_stores(tiny_store, tmp_path):
    runner = CliRunner()
    run, out = tmp_path / "run", tmp_path / "adapted"
    trained = runner.invoke(main, ["train", str(tiny_store), "--out", str(run), "--epochs", "1", "--lr", "1e-3",
                                   "--hidden-channels", "4", "--precise-bn", "0", "--batch-size", "16"])
    assert trained.exit_code == 0, trained.output
    result = runner.invoke(main, ["eval", str(run), str(tiny_store), "--out", str(out)])
    assert result.exit_code == 2 and "only --task adapt runs output networks" in result.output, result.output
    assert not out.exists()


@pytest.mark.parametrize("given, expected", [({}, (16, 16)), ({"hidden_channels": 3, "input_reduction": 5}, (3, 5))])
def test_adapt_defaults_to_the_papers_adapter_size(pair_store, tmp_path, given, expected):
    """Unset, --task adapt's DWSNet is the paper's (16 channels, d_0' = 16); given sizes win, and the
    resolved ones are what the run records and resumes with."""
    from dws.tasks.options import TrainOptions
    from dws.tasks.prepare import prepare_run

    run = prepare_run(TrainOptions(str(pair_store), task="adapt", out=str(tmp_path / "run"), precise_bn=0,
                                   **given), **QUIET)
    got = run.model_kwargs["hidden_channels"], run.model_kwargs["input_reduction"]
    assert got == expected == (run.opts.hidden_channels, run.opts.input_reduction)
    assert run.checkpoints.settings["--hidden-channels"] == expected[0]


def test_other_tasks_keep_48_channels_and_no_reduction(tiny_store, tmp_path):
    from dws.tasks.options import TrainOptions
    from dws.tasks.prepare import prepare_run

    run = prepare_run(TrainOptions(str(tiny_store), out=str(tmp_path / "run"), precise_bn=0), **QUIET)
    assert (run.model_kwargs["hidden_channels"], run.model_kwargs["input_reduction"]) == (48, None)
