"""Classifier zoos: batched training equals one network at a time, determinism, resume, bad input,
diverging networks, and a store that numpy alone evaluates to its recorded accuracies."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cli import main
from clf_helpers import synthetic_images, trajectory_options, write_idx, write_mnist_like
from generate_helpers import kill_after_chunks
from zoo.fit.adam import MaskedAdam
from zoo.generate.kinds import KINDS
from zoo.generate.run import GenerateOptions, generate
from zoo.sources import DataError, get_source
from zoo.store import StoreError, WeightStore
from zoo.train.data import ClassifierData, batch_plan, classifier_data
from zoo.train.evaluate import predictions
from zoo.train.mlp import ACTIVATIONS, MlpSpec, backward, forward_train, get_activation, init_params, logits
from zoo.train.reference import parameters_of, train_one
from zoo.train.runs import Diversity, draw_run
from zoo.train.schedule import TrainSchedule
from zoo.train.trainer import class_loss_and_grad, flushed_denormals, train_runs

QUIET = dict(log=lambda *_: None)


def small_data(shape=(4, 4, 3), n=800, n_test=300, seed=0) -> ClassifierData:
    images, labels = synthetic_images(n, shape, seed)
    test, test_labels = synthetic_images(n_test, shape, seed + 1)
    flat = lambda x: np.ascontiguousarray(x.reshape(len(x), *shape).transpose(0, 3, 1, 2).reshape(len(x), -1))
    c = shape[2]
    return ClassifierData(flat(images), labels.astype(np.int64), flat(test), test_labels.astype(np.int64), shape,
                          (0.5,) * c, (0.25,) * c)


# --- the pieces: Adam, backward, loss ------------------------------------------------------------

def test_stacked_adam_equals_torch_adam_network_by_network():
    """One Adam over [K, ...] tensors with per-network rates and weight decays = K torch.optim.Adams."""
    torch.manual_seed(0)
    K, steps = 4, 8
    lrs, decays = [1e-3, 5e-3, 2e-2, 1e-4], [0.0, 1e-2, 1e-4, 3e-3]
    params = [torch.randn(K, 5, 7), torch.randn(K, 5)]
    ours = MaskedAdam([p.clone() for p in params], lr=torch.tensor(lrs, dtype=torch.float64),
                      weight_decay=torch.tensor(decays))
    refs = [[p[k].clone().requires_grad_() for p in params] for k in range(K)]
    optims = [torch.optim.Adam(ps, lr=lr, weight_decay=wd) for ps, lr, wd in zip(refs, lrs, decays)]
    for _ in range(steps):
        grads = [torch.randn_like(p) * 10 ** torch.randint(-6, 1, p.shape).float() for p in params]
        ours.step([g.clone() for g in grads])
        for k, (ps, opt) in enumerate(zip(refs, optims)):
            for p, g in zip(ps, grads):
                p.grad = g[k].clone()
            opt.step()
    for k in range(K):
        for p, ref in zip(ours.params, refs[k]):
            np.testing.assert_allclose(p[k].numpy(), ref.detach().numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_hand_written_backward_matches_autograd(name):
    """Gradients of the per-network losses, with dropout masks, pair classes and a padded batch."""
    torch.manual_seed(1)
    activation = get_activation(name)
    spec = MlpSpec((6, 5, 4, 10))
    K, B = 3, 7
    weights, biases = init_params(spec, [11, 12, 13], [1.0, 2.0, 0.5])
    x = torch.randn(K, B, 6)
    masks = [(torch.rand(K, B, d) > 0.3).float() / 0.7 for d in (5, 4)]
    classes = torch.tensor([[1, 4], [0, 9], [3, 7]])
    targets = torch.randint(0, 2, (K, B))
    targets[2, 5:] = -1  # a shorter batch
    out, cache = forward_train(weights, biases, x, activation, masks)
    loss, grad_out = class_loss_and_grad(out, classes, targets)
    grad_w, grad_b = backward(weights, cache, grad_out, activation)

    leaves = [t.clone().requires_grad_() for t in weights + biases]
    total = 0
    for k in range(K):
        h = x[k]
        for m in range(spec.num_layers):
            h = h @ leaves[m][k].T + leaves[spec.num_layers + m][k]
            if m < spec.num_layers - 1:
                h = activation.forward(h) * masks[m][k]
        keep = targets[k] >= 0
        ce = torch.nn.functional.cross_entropy(h[keep][:, classes[k]], targets[k][keep])
        assert ce.item() == pytest.approx(loss[k].item(), rel=1e-5)
        total = total + ce
    total.backward()
    for ours, leaf in zip(grad_w + grad_b, leaves):
        np.testing.assert_allclose(ours.numpy(), leaf.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_flushed_denormals_are_zero_inside_and_kept_outside():
    tiny = torch.tensor([1e-39], dtype=torch.float32)  # a denormal float32
    with flushed_denormals("cpu"):
        assert (tiny * 1.0).item() == 0.0
    assert (tiny * 1.0).item() != 0.0


# --- batched training ----------------------------------------------------------------------------

@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_batched_training_equals_one_network_at_a_time(activation):
    """Three networks trained together = each trained alone by an nn.Sequential + torch.optim.Adam
    on the same batches (different rates, decays, init scales; pairs of classes). Adam divides by
    the gradient's size, so rounding-level gradient differences (where a gradient cancels) move a
    parameter by a small fraction of a step: within 0.1% of the step size after 8 steps."""
    data = small_data()
    spec = MlpSpec((48, 16, 16, 10))
    schedule = TrainSchedule(epochs=1, batch_size=32, lr=5e-3, steps=8)
    runs = [replace(draw_run(0, r, 10, 2, 5e-3), activation=activation, lr=lr, weight_decay=wd, init_scale=s)
            for r, lr, wd, s in [(0, 5e-3, 0.0, 1.0), (1, 1e-3, 1e-3, 2.0), (2, 2e-2, 0.0, 0.5)]]
    batched = train_runs(spec, data, runs, schedule, evaluate=False)
    for run, result in zip(runs, batched):
        net, losses = train_one(spec, data, run, schedule)
        weights, biases = parameters_of(net)
        for m in range(spec.num_layers):
            np.testing.assert_allclose(result.weights[m][-1], weights[m].numpy(), rtol=0, atol=1e-3 * run.lr)
            np.testing.assert_allclose(result.biases[m][-1], biases[m].numpy(), rtol=0, atol=1e-3 * run.lr)
        assert result.steps == [8] and result.diverged_at is None
        # the stored loss is the mean batch loss of the last pass over the run's images
        last_pass = batch_plan(run, data.train_labels, schedule).pass_steps
        assert 1 < last_pass < 8 and result.train_loss[0] == pytest.approx(losses[-last_pass:].mean(), rel=1e-4)


def test_results_depend_on_seed_and_run_only():
    """Which runs train together (group size, order, mixed activations) changes nothing, bit for bit."""
    data = small_data()
    spec = MlpSpec((48, 12, 10))
    schedule = TrainSchedule(epochs=1, batch_size=16, lr=5e-3, checkpoint_every=3)
    runs = [draw_run(7, r, 10, 10, 5e-3, Diversity()) for r in range(7)]
    assert len({r.activation for r in runs}) > 1 and any(r.dropout > 0 for r in runs)
    assert len({len(batch_plan(r, data.train_labels, schedule).indices) for r in runs}) == 1  # equal lengths
    one = train_runs(spec, data, runs, schedule, group=1)
    for other in (train_runs(spec, data, runs, schedule, group=3),
                  train_runs(spec, data, runs[::-1], schedule, group=16)[::-1]):
        for a, b in zip(one, other):
            assert a.run == b.run and a.steps == b.steps
            for m in range(spec.num_layers):
                np.testing.assert_array_equal(a.weights[m], b.weights[m])
            np.testing.assert_array_equal(a.test_accuracy, b.test_accuracy)
            np.testing.assert_array_equal(a.train_loss, b.train_loss)


def test_the_pytorch_adam_path_agrees_with_the_native_one(monkeypatch):
    """What a GPU (or a CPU without the C kernels) runs: the same training up to float rounding."""
    data = small_data()
    spec = MlpSpec((48, 16, 16, 10))
    schedule = TrainSchedule(epochs=1, batch_size=32, lr=5e-3, steps=8)
    runs = [draw_run(3, r, 10, 10, 5e-3, Diversity()) for r in range(4)]
    native = train_runs(spec, data, runs, schedule)
    monkeypatch.setattr("zoo.fit.adam.native.library", lambda: None)
    fallback = train_runs(spec, data, runs, schedule)
    for a, b in zip(native, fallback):
        for m in range(spec.num_layers):
            np.testing.assert_allclose(a.weights[m], b.weights[m], rtol=0, atol=1e-3 * a.run.lr)


def test_a_diverging_network_stops_and_leaves_the_others_alone():
    data = small_data()
    spec = MlpSpec((48, 16, 10))
    schedule = TrainSchedule(epochs=1, batch_size=32, lr=5e-3, checkpoint_every=2, steps=8)
    runs = [draw_run(0, r, 10, 10, 5e-3) for r in range(3)]
    wild = [runs[0], replace(runs[1], lr=1e30), runs[2]]  # logits overflow float32
    calm = train_runs(spec, data, [runs[0], runs[2]], schedule)
    mixed = train_runs(spec, data, wild, schedule)
    for a, b in zip(calm, [mixed[0], mixed[2]]):
        for m in range(spec.num_layers):
            np.testing.assert_array_equal(a.weights[m], b.weights[m])
    bad = mixed[1]
    assert bad.diverged_at is not None and 0 < bad.diverged_at <= 8
    statuses = [bad.status(c) for c in range(len(bad.steps))]
    assert statuses == ["ok" if s < bad.diverged_at else "diverged" for s in bad.steps]
    assert all(np.isfinite(w).all() for w in bad.weights + bad.biases)  # storable
    assert np.isnan(bad.test_accuracy[np.array(statuses) == "diverged"]).all()
    assert np.isnan(bad.train_loss[np.array(statuses) == "diverged"]).all()
    assert not np.isnan(bad.test_accuracy[np.array(statuses) == "ok"]).any()


def test_predictions_are_the_float64_argmax():
    """The float32 path with its float64 recheck gives the float64 answer, exact ties included."""
    torch.manual_seed(3)
    spec = MlpSpec((20, 30, 30, 10))
    weights, biases = init_params(spec, [5], [3.0])
    w, b = [t[0] for t in weights], [t[0] for t in biases]
    x = torch.randn(4000, 20)
    classes = torch.tensor([2, 5, 7])
    exact = logits([t.double() for t in w], [t.double() for t in b], x.double(), get_activation("relu"))
    expected = classes[exact[:, classes].argmax(1)]
    assert torch.equal(predictions(w, b, get_activation("relu"), x, classes), expected)
    # dead network: every logit equals its bias, ties resolve to the first of the classes
    zero = [torch.zeros_like(t) for t in w]
    tie_b = [torch.zeros_like(t) for t in b]
    assert (predictions(zero, tie_b, get_activation("relu"), x, classes) == 2).all()


# --- generating stores ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mnist_like(tmp_path_factory):
    return write_mnist_like(tmp_path_factory.mktemp("mnist-like"))


@pytest.fixture(scope="module")
def trajectory_store(mnist_like, tmp_path_factory):
    out = tmp_path_factory.mktemp("traj") / "store"
    generate(GenerateOptions(out=str(out), **trajectory_options(mnist_like)), **QUIET)
    return out


@pytest.fixture(scope="module")
def diverse_store(mnist_like, tmp_path_factory):
    out = tmp_path_factory.mktemp("diverse") / "store"
    generate(GenerateOptions(out=str(out), **trajectory_options(mnist_like, diversity=True, limit=12, steps=8)),
             **QUIET)
    return out


def test_diverse_store_records_each_runs_hyperparameters(diverse_store):
    store = WeightStore(diverse_store)
    t, m = store.networks.to_pydict(), store.manifest
    assert m["architecture"]["activation"].startswith("per network") and m["generation"]["diversity"]["lr"]
    runs = {r: i for i, r in reversed(list(enumerate(t["trajectory_id"])))}  # first row of each run
    assert len({t["activation"][i] for i in runs.values()}) > 1
    for name in ("lr", "weight_decay", "dropout", "init_scale", "data_fraction"):
        values = [t[name][i] for i in runs.values()]
        assert len(set(values)) == len(values)  # drawn per run
        low, high = m["generation"]["diversity"][name]
        assert all(low <= v <= high for v in values)
        assert all(t[name][i] == t[name][runs[r]] for i, r in enumerate(t["trajectory_id"]))  # constant in a run


def test_trajectory_store_layout(trajectory_store):
    """Runs are split whole; a chunk holds whole runs; a limit keeps the first runs of each split."""
    store = WeightStore(trajectory_store)
    m, t = store.manifest, store.networks.to_pydict()
    assert m["runs"] == {"count": 8, "checkpoints_per_run": 4, "rule": m["runs"]["rule"]}
    assert m["chunk_size"] == 8 and m["num_networks"] == 32  # asked 8 = 2 runs of 4 checkpoints
    assert {s: v["runs"] for s, v in m["splits"].items()} == {"train": 6, "val": 1, "test": 1}
    assert sorted(set(t["trajectory_id"])) == [0, 1, 2, 3, 4, 5, 150, 175]
    assert t["step"][:4] == [0, 4, 8, 12] and t["trajectory_id"][:5] == [0, 0, 0, 0, 1]
    for run in set(t["trajectory_id"]):
        assert len({t["split"][i] for i in range(32) if t["trajectory_id"][i] == run}) == 1
    assert all(c == list(range(10)) for c in t["classes"]) and set(t["status"]) == {"ok"}
    acc = np.array(t["test_accuracy"])
    assert np.all((acc >= 0) & (acc <= 1)) and acc[3::4].mean() > acc[0::4].mean()  # training helps
    assert t["train_loss"][0] is None and all(v > 0 for v in t["train_loss"][1:4])
    assert m["architecture"]["family"] == "mlp-classifier" and m["targets"] == ["test_accuracy"]


def test_pair_store_trains_each_network_on_its_two_classes(pair_store, cifar_like):
    store = WeightStore(pair_store)
    t = store.networks.to_pydict()
    assert all(len(c) == 2 and c[0] < c[1] for c in t["classes"]) and len({tuple(c) for c in t["classes"]}) > 3
    assert t["trajectory_id"] == [0, 1, 2, 3, 4, 5, 6, 7, 4000, 4500]
    # the pair is drawn from (seed, run): a zoo with other runs beside it draws the same pairs
    assert [list(draw_run(0, r, 10, 2, 5e-3).classes) for r in t["trajectory_id"]] == t["classes"]
    # the other 8 output rows get no gradient: they keep their initial values
    spec = MlpSpec(store.widths)
    w, b = init_params(spec, t["seed"], [1.0] * len(t["seed"]))
    last = store.read(0, store.num_networks)[f"W{spec.num_layers}"]
    for i, classes in enumerate(t["classes"]):
        others = [c for c in range(10) if c not in classes]
        np.testing.assert_array_equal(last[i][others], w[-1][i][others].numpy())
        assert not np.array_equal(last[i][classes], w[-1][i][classes].numpy())
    # steps: 2 epochs over each pair's images of the 5 batches, batch 16
    from zoo.sources import get_source

    labels = get_source("cifar10", cifar_like, verify=False).official("train").labels
    for classes, step in zip(t["classes"], t["step"]):
        assert step == 2 * -(-np.isin(labels, classes).sum() // 16)


NUMPY_EVALUATION = textwrap.dedent("""
    import gzip, json, math, pickle, struct, sys
    import numpy as np, pyarrow.parquet as pq, zarr

    root = sys.argv[1]
    manifest = json.load(open(f"{root}/manifest.json"))
    arch, inp = manifest["architecture"], manifest["architecture"]["input"]
    group = zarr.open_group(f"{root}/{manifest['arrays']}", mode="r")  # format v2: the Zarr group is arrays/
    rows = pq.read_table(f"{root}/networks.parquet").to_pydict()
    files = {f["name"]: f["path"] for f in manifest["source"]["files"]}

    def idx(path):
        raw = gzip.decompress(open(path, "rb").read())
        dims = raw[3]
        shape = struct.unpack(f">{dims}I", raw[4:4 + 4 * dims])
        return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)

    if "test_batch" in files:  # CIFAR-10: RGB planes per row
        batch = pickle.load(open(files["test_batch"], "rb"), encoding="latin1")
        h, w, c = inp["image_shape"]
        images = np.asarray(batch["data"]).reshape(-1, c, h, w).transpose(0, 2, 3, 1)
        labels = np.asarray(batch["labels"])
    else:
        name = next(n for n in files if n.startswith("t10k-images"))
        images = idx(files[name])[..., None]
        labels = idx(files[name.replace("images-idx3", "labels-idx1")]).astype(np.int64)
    h, w, c = inp["image_shape"]
    assert inp["flatten"].startswith("C x H x W")
    x = images.transpose(0, 3, 1, 2).reshape(len(images), -1).astype(np.float32)
    mean = np.repeat(np.asarray(inp["mean"], np.float32), h * w)
    std = np.repeat(np.asarray(inp["std"], np.float32), h * w)
    x = (x / np.float32(inp["pixel_scale"]) - mean) / std
    erf = np.vectorize(math.erf)
    act = {"relu": lambda v: np.maximum(v, 0), "tanh": np.tanh, "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
           "gelu": lambda v: v * (1 + erf(v / math.sqrt(2))) / 2}
    layers = len(arch["widths"]) - 1
    checked = 0
    for i in range(len(rows["index"])):
        if rows["status"][i] != "ok":
            continue
        name = rows["activation"][i] if "per network" in arch["activation"] else arch["activation"]
        classes = np.asarray(rows["classes"][i])
        keep = np.isin(labels, classes)
        v = x[keep].astype(np.float64)
        for m in range(1, layers + 1):
            v = v @ group[f"W{m}"][i].astype(np.float64).T + group[f"b{m}"][i].astype(np.float64)
            if m < layers:
                v = act[name](v)
        predicted = classes[np.argmax(v[:, classes], axis=1)]
        accuracy = np.float32(np.mean(predicted == labels[keep]))
        assert accuracy == np.float32(rows["test_accuracy"][i]), (i, accuracy, rows["test_accuracy"][i])
        checked += 1
    assert not any(m in sys.modules for m in ("torch", "zoo", "dws")), "used more than numpy, zarr, pyarrow"
    print(checked)
""")


@pytest.mark.parametrize("store", ["trajectory_store", "pair_store", "diverse_store"])
def test_numpy_only_evaluation_reproduces_stored_accuracies(store, request, tmp_path):
    """Another lab's evaluation: numpy + zarr + pyarrow, the manifest, the test files; nothing of ours."""
    root = request.getfixturevalue(store)
    script = tmp_path / "evaluate.py"
    script.write_text(NUMPY_EVALUATION)
    done = subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) == WeightStore(root).num_networks


def test_store_does_not_depend_on_workers_or_chunking(trajectory_store, mnist_like, tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "ray"
    generate(GenerateOptions(out=str(out), **trajectory_options(mnist_like, chunk_size=12, workers=2, use_ray=True)),
             **QUIET)
    a, b = WeightStore(trajectory_store), WeightStore(out)
    assert b.manifest["chunk_size"] == 12 and b.num_chunks == 3 and a.num_chunks == 4
    for name, values in a.read(0, a.num_networks).items():
        np.testing.assert_array_equal(values, b.read(0, b.num_networks)[name])
    assert a.networks.to_pydict() == b.networks.to_pydict()


def test_rerun_after_kill_resumes_without_gaps(mnist_like, tmp_path):
    """SIGKILL after two of four chunks; the same command finishes the store, equal to an uninterrupted one."""
    slow = dict(steps=300, checkpoint_every=100)  # 4 checkpoints per run: 4 chunks
    reference = tmp_path / "reference"
    generate(GenerateOptions(out=str(reference), **trajectory_options(mnist_like, **slow)), **QUIET)
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "cli", "generate", "mnist-classifiers", "--out", str(out), "--data-root",
           str(mnist_like), "--source-option", "verify=false", "--limit", "8", "--batch-size", "32", "--steps", "300",
           "--checkpoint-every", "100", "--chunk-size", "8"]
    state = kill_after_chunks(cmd, out, chunks=2)
    assert state["status"] == "in_progress" and len(state["complete_chunks"]) == 2
    logs = []
    generate(GenerateOptions(out=str(out), **trajectory_options(mnist_like, **slow)), log=logs.append)
    assert any("resuming" in line and "chunks left" in line for line in logs)
    a, b = WeightStore(reference), WeightStore(out)
    for name, values in a.read(0, a.num_networks).items():
        np.testing.assert_array_equal(values, b.read(0, b.num_networks)[name])
    assert a.networks.to_pydict() == b.networks.to_pydict()


def test_rerun_with_other_settings_is_refused(trajectory_store, mnist_like):
    with pytest.raises(StoreError, match="different settings") as err:
        generate(GenerateOptions(out=str(trajectory_store), **trajectory_options(mnist_like, batch_size=16)), **QUIET)
    assert "generation.train.batch_size: store 32, asked 16" in str(err.value)


# --- bad input -----------------------------------------------------------------------------------

def test_unverified_cifar_batches_are_refused_unless_asked(cifar_like, tmp_path):
    with pytest.raises(DataError, match="MD5"):
        generate(GenerateOptions(kind="cifar10-classifiers", out=str(tmp_path / "x"), data_root=str(cifar_like),
                                 limit=4, batch_size=16, steps=2, progress=False), **QUIET)
    assert not (tmp_path / "x").exists()
    manifest = generate(GenerateOptions(kind="cifar10-classifiers", out=str(tmp_path / "y"), data_root=str(cifar_like),
                                        source_options={"verify": False}, limit=4, batch_size=16, steps=2,
                                        progress=False), **QUIET)
    assert manifest["generation"]["source_options"] == {"verify": False}
    files = manifest["source"]["files"]
    assert len(files) == 6 and all(not f["verified"] and len(f["content_md5"]) == 32 for f in files)


@pytest.mark.parametrize("defect, message", [
    ("label 12", "out of range"),
    ("fewer labels", "images but .* labels"),
])
def test_bad_label_files_are_refused_before_anything_is_written(tmp_path, defect, message):
    root = write_mnist_like(tmp_path / "data", n_train=100, n_test=50)
    _, labels = synthetic_images(100, (28, 28), 0)
    labels = labels.copy()
    if defect == "label 12":
        labels[17] = 12
    else:
        labels = labels[:-3]
    write_idx(root / "train-labels-idx1-ubyte.gz", labels)
    out = tmp_path / "store"
    with pytest.raises(DataError, match=message):
        generate(GenerateOptions(out=str(out), **trajectory_options(root)), **QUIET)
    assert not out.exists()


def test_cli_reports_a_diverged_zoo_and_the_store_records_it(mnist_like, tmp_path):
    out = tmp_path / "wild"
    args = ["generate", "mnist-classifiers", "--out", str(out), "--data-root", str(mnist_like), "--source-option",
            "verify=false", "--limit", "4", "--batch-size", "32", "--steps", "4", "--checkpoint-every", "2",
            "--lr", "1e12"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "runs diverged" in result.output and "diverged:" in result.output
    store = WeightStore(out)
    t = store.networks.to_pydict()
    assert "diverged" in set(t["status"]) and store.manifest["training"]["diverged_runs"]
    assert all(a is None for a, s in zip(t["test_accuracy"], t["status"]) if s == "diverged")
    assert all(np.isfinite(v).all() for v in store.read(0, store.num_networks).values())
    assert all(np.isfinite(mean).all() and np.isfinite(std).all() for mean, std in store.stats().values())


@pytest.mark.parametrize("kind, options, message", [
    ("mnist-classifiers", ["--views", "2"], "--views applies to INR kinds only"),
    ("mnist-classifiers", ["--init", "reference"], "--init applies to INR kinds only"),
    ("mnist-inr", ["--epochs", "2"], "--epochs applies to classifier zoos only"),
    ("mnist-inr", ["--diversity"], "--diversity applies to classifier zoos only"),
    ("mnist-classifiers", ["--batch-size", "0"], "--batch-size must be at least 1"),
    ("mnist-classifiers", ["--source-option", "verify"], "expected KEY=VALUE"),
])
def test_options_of_the_other_family_are_refused(tmp_path, kind, options, message):
    out = tmp_path / "store"
    result = CliRunner().invoke(main, ["generate", kind, "--out", str(out), *options])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not out.exists()


def test_pair_trajectories_need_a_fixed_number_of_steps(cifar_like, tmp_path):
    with pytest.raises(ValueError, match="fixed --steps"):
        generate(GenerateOptions(kind="cifar10-classifiers", out=str(tmp_path / "s"), data_root=str(cifar_like),
                                 source_options={"verify": False}, limit=8, batch_size=16, checkpoint_every=2,
                                 progress=False), **QUIET)


# --- zoo info / zoo show -------------------------------------------------------------------------

@pytest.mark.parametrize("store", ["trajectory_store", "pair_store"])
def test_info_and_show(store, request, tmp_path):
    root = request.getfixturevalue(store)
    runner = CliRunner()
    info = runner.invoke(main, ["info", str(root)])
    assert info.exit_code == 0, info.output
    assert "test acc   p5" in info.output and "runs)" in info.output and "every run trained" in info.output
    assert ("final acc" in info.output) == (store == "trajectory_store")
    assert ("class sets of 2" in info.output) == (store == "pair_store")
    out = tmp_path / "acc.png"
    shown = runner.invoke(main, ["show", str(root), "--out", str(out), "--count", "3"])
    assert shown.exit_code == 0, shown.output
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_show_says_what_it_draws_and_refuses_what_it_cannot(trajectory_store, pair_store, tmp_path):
    runner = CliRunner()
    out = tmp_path / "many.png"
    shown = runner.invoke(main, ["show", str(trajectory_store), "--out", str(out), "--count", "50"])
    assert shown.exit_code == 0, shown.output
    assert "the store has 8 runs: drawing all of them, not 50" in shown.output and out.exists()
    shown = runner.invoke(main, ["show", str(pair_store), "--out", str(tmp_path / "pairs.png"), "--count", "5"])
    assert shown.exit_code == 0 and "--count does not apply" in shown.output, shown.output
    for options, message in ((["--count", "0"], "between 1 and 100"),
                             (["--out", str(tmp_path / "no" / "acc.png")], "does not exist")):
        refused = runner.invoke(main, ["show", str(trajectory_store), "--out", str(tmp_path / "x.png"), *options])
        assert refused.exit_code == 2 and message in refused.output, refused.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.png", "pairs.png"]


def test_info_on_an_unfinished_classifier_store_summarizes_its_progress(trajectory_store, tmp_path):
    from test_inspect import unfinish

    store = unfinish(trajectory_store, tmp_path / "store", [0])
    result = CliRunner().invoke(main, ["info", str(store)])
    assert result.exit_code == 0, result.output
    manifest = WeightStore(store, require_complete=False).manifest
    assert f"1 of {manifest['num_chunks']} chunks written" in result.output
    assert "test acc   p5" in result.output and "(networks written so far)" in result.output


def test_training_reports_progress_through_training_and_testing(mnist_like):
    kind = KINDS["mnist-classifiers"]
    data = classifier_data(get_source("mnist", mnist_like, verify=False), kind.input_mean, kind.input_std)
    runs = [draw_run(0, r, 10, 10, 5e-3, None) for r in range(3)]
    schedule = TrainSchedule(epochs=1, batch_size=64, lr=5e-3, steps=6, checkpoint_every=2)
    reports = []
    results = train_runs(MlpSpec(kind.widths), data, runs, schedule, group=2, progress=reports.append)
    assert np.all(np.diff(reports) >= 0) and reports[-1] == pytest.approx(1.0)
    assert len(reports) == 2 * 6 + 3  # every step of the two groups, every run tested
    assert 0 < reports[0] < reports[6 + 6 - 1] < 1  # the testing is part of the work
    quiet = train_runs(MlpSpec(kind.widths), data, runs, schedule, group=2)
    for a, b in zip(results, quiet):
        np.testing.assert_array_equal(a.weights[0], b.weights[0])
