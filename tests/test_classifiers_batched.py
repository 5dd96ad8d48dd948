"""The GPU-shaped classifier path, checked on the CPU: many checkpoints evaluated as one stack give
exactly the one-network rule's predictions (near-ties, exact ties, overflowing logits included),
and the step loop with its bookkeeping on the device (``sync_free``) trains exactly as the loop
that reads it every step: same checkpoints, losses and divergence."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from test_classifiers import small_data
from zoo.train.data import normalized
from zoo.train.evaluate import accuracy, correct_counts, predictions, stacked_predictions, stack_accuracies
from zoo.train.mlp import MlpSpec, get_activation, init_params
from zoo.train.runs import Diversity, draw_run
from zoo.train.schedule import TrainSchedule
from zoo.train.trainer import host_arrays, train_runs

ROOT = Path(__file__).resolve().parent.parent


def tricky_networks(spec: MlpSpec, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Random networks, then some whose logits tie or nearly tie, one dead, one overflowing."""
    K = 12
    weights, biases = init_params(spec, list(range(seed, seed + K)), [3.0] * K)
    gen = torch.Generator().manual_seed(seed)
    last_w, last_b = weights[-1], biases[-1]
    for k, scale in zip(range(0, 6), (0.0, 1e-9, 1e-7, 1e-6, 1e-5, 1e-4)):  # output 3 copies output 1, nearly
        last_w[k, 3] = last_w[k, 1] * (1 + scale * torch.randn(last_w.shape[2], generator=gen))
        last_b[k, 3] = last_b[k, 1]
    for w in weights:  # network 6 is dead: every logit is its bias, and the biases tie
        w[6].zero_()
    last_b[6] = 0.25
    for w in weights:  # network 7's logits overflow float32 (inf, NaN), not float64
        w[7].mul_(1e12)
    return weights, biases


@pytest.mark.parametrize("name", ["relu", "tanh", "gelu"])
@pytest.mark.parametrize("classes", [list(range(10)), [1, 3, 8], [3, 1]])
def test_stacked_predictions_equal_the_one_network_rule(name, classes):
    spec = MlpSpec((20, 30, 30, 10))
    weights, biases = tricky_networks(spec)
    activation = get_activation(name)
    x = torch.randn(700, 20, generator=torch.Generator().manual_seed(1))
    chosen = torch.tensor(classes)
    one = torch.stack([predictions([w[k] for w in weights], [b[k] for b in biases], activation, x, chosen)
                       for k in range(len(weights[0]))])
    assert torch.equal(stacked_predictions(weights, biases, activation, x, chosen), one)
    # small blocks of networks, images and float64 rechecks: the same, block by block
    assert torch.equal(stacked_predictions(weights, biases, activation, x, chosen, recheck_bytes=1), one)
    labels = torch.tensor(classes)[torch.randint(0, len(classes), (700,), generator=torch.Generator().manual_seed(2))]
    for max_bytes in (1, 50_000, 1 << 30):
        counts = correct_counts(weights, biases, activation, x, labels, chosen, max_bytes)
        assert torch.equal(counts, (one == labels).sum(dim=1))
    assert (one[6] == classes[0]).all()  # the dead network's exact tie: the first of its classes


def test_zoo_test_accuracies_equal_per_network_accuracy():
    """A group's checkpoints of several class sets: each network on its classes' test images."""
    data = small_data(shape=(4, 5, 1))
    spec = MlpSpec((20, 16, 10))
    weights, biases = tricky_networks(spec, seed=5)
    sets = [(0, 1), (2, 7), tuple(range(10)), (0, 1)] * 3
    got = stack_accuracies(data, weights, biases, get_activation("relu"), sets, "cpu", max_bytes=20_000)
    x, labels = normalized(data, "test"), torch.from_numpy(data.test_labels)
    for k, classes in enumerate(sets):
        rows = torch.isin(labels, torch.tensor(classes))
        want = accuracy([w[k] for w in weights], [b[k] for b in biases], get_activation("relu"), x[rows], labels[rows],
                        torch.tensor(classes))
        assert np.float32(got[k].item()) == np.float32(want)


def assert_same(a_runs, b_runs):
    for a, b in zip(a_runs, b_runs, strict=True):
        assert a.run == b.run and a.steps == b.steps and a.diverged_at == b.diverged_at
        for x, y in zip(a.weights + a.biases, b.weights + b.biases, strict=True):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(a.train_loss, b.train_loss)
        np.testing.assert_array_equal(a.test_accuracy, b.test_accuracy)


def zoo_cases():
    spec = MlpSpec((48, 16, 16, 10))
    calm = [draw_run(0, r, 10, 10, 5e-3) for r in range(4)]
    return {
        # sampled rates, decays, dropout, activations, data fractions; trajectories
        "diversity": (spec, [draw_run(7, r, 10, 10, 5e-3, Diversity()) for r in range(9)],
                      TrainSchedule(epochs=2, batch_size=32, lr=5e-3, checkpoint_every=3)),
        # networks diverging at step 0 (logits overflow), at step 1 (a huge rate), later (its output
        # layer grows until the logits overflow; tanh: a group of its own)
        "divergence": (spec, [calm[0], replace(calm[1], init_scale=1e36), replace(calm[2], lr=1e30),
                              replace(calm[3], lr=1.2e36, activation="tanh")],
                       TrainSchedule(epochs=1, batch_size=32, lr=5e-3, checkpoint_every=2, steps=9)),
        "all diverge": (spec, [replace(r, lr=1e30) for r in calm],
                        TrainSchedule(epochs=1, batch_size=32, lr=5e-3, checkpoint_every=2, steps=9)),
        # pairs of classes with different numbers of images: runs of different lengths
        "pairs": (spec, [draw_run(0, r, 10, 2, 5e-3) for r in range(12)],
                  TrainSchedule(epochs=2, batch_size=16, lr=5e-3, checkpoint_every=5)),
        "pairs, final": (spec, [draw_run(3, r, 10, 2, 5e-3, Diversity()) for r in range(10)],
                         TrainSchedule(epochs=1, batch_size=16, lr=5e-3)),
    }


@pytest.mark.parametrize("case", list(zoo_cases()))
def test_the_sync_free_loop_trains_exactly_as_the_host_loop(case):
    spec, runs, schedule = zoo_cases()[case]
    data = small_data()
    host = train_runs(spec, data, runs, schedule, group=4, sync_free=False)
    device = train_runs(spec, data, runs, schedule, group=4, sync_free=True)
    assert_same(host, device)
    assert_same(host, train_runs(spec, data, runs, schedule, sync_free=True))  # one group
    if case == "divergence":
        assert [r.diverged_at for r in host][:3] == [None, 0, 1] and 1 < host[3].diverged_at < 9
    if case == "pairs":
        assert len({len(r.steps) for r in host}) > 1


def test_diverged_networks_stay_finite_with_the_pytorch_adam(monkeypatch):
    """The GPU's optimizer (no C kernel) scales a still network's update by 0: its gradient is zeroed
    first, or a non-finite one would write NaN into the parameters it keeps."""
    monkeypatch.setattr("zoo.fit.adam.native.library", lambda: None)
    spec, runs, schedule = zoo_cases()["divergence"]
    data = small_data()
    for sync_free in (False, True):
        results = train_runs(spec, data, runs, schedule, sync_free=sync_free)
        assert [r.diverged_at is not None for r in results] == [False, True, True, True]
        assert all(np.isfinite(a).all() for r in results for a in r.weights + r.biases)
        init = init_params(spec, [runs[1].seed], [runs[1].init_scale])
        np.testing.assert_array_equal(results[1].weights[0][-1], init[0][0][0].numpy())  # never moved


def test_checkpoints_are_written_into_the_callers_arrays():
    spec, runs, schedule = zoo_cases()["diversity"]
    data = small_data()
    alone = train_runs(spec, data, runs, schedule, group=2)
    count = sum(len(r.steps) for r in alone)
    out = host_arrays(spec, count)
    results = train_runs(spec, data, runs, schedule, out=out, group=2)
    assert_same(alone, results)
    np.testing.assert_array_equal(np.concatenate([r.weights[1] for r in results]), out[0][1])
    assert all(np.shares_memory(r.biases[0], out[1][0]) for r in results)
    with pytest.raises(ValueError, match="room for"):
        train_runs(spec, data, runs, schedule, out=host_arrays(spec, count - 1))


def test_benchmark_runs_on_a_cpu():
    """The benchmark the GPU session runs, at toy sizes: both sides, the ratio, the subset stated."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/classifier_throughput.py"), "--kind", "fmnist",
                           "--networks", "3", "--single", "1", "--steps", "4", "--train-images", "3000",
                           "--test-images", "500", "--time-limit", "60"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "one at a time" in done.stdout and "batched" in done.stdout and "subset" in done.stdout
