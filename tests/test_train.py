"""``zoo train`` / ``zoo eval``: run directories, re-evaluation and refusal of incompatible stores."""

import json

import numpy as np
import pytest
import torch

from dws.tasks.objectives import nt_xent
from dws.stream import WeightStoreLoader
from dws.tasks.options import MODELS, TrainOptions
from dws.tasks.run import train_run
from dws.tasks.rundir import evaluate_run
from dws.tasks.trainer import recalibrate_batchnorm
from zoo.generate.run import GenerateOptions, generate
from zoo.store import StoreError, WeightStore

QUIET = dict(progress=False)


@pytest.fixture(scope="module", params=[0, 40], ids=["running-bn", "precise-bn"])
def trained_run(tiny_store, tmp_path_factory, request):
    out = tmp_path_factory.mktemp("runs") / "dws"
    metrics = train_run(TrainOptions(store=str(tiny_store), model="dwsnet", epochs=2, lr=1e-3, batch_size=16,
                                     hidden_channels=8, precise_bn=request.param, out=str(out), **QUIET),
                        log=lambda *_: None)
    return out, metrics


def test_run_directory_holds_config_metrics_checkpoint_and_curve(trained_run):
    out, metrics = trained_run
    for name in ("config.json", "metrics.json", "best.pt", "curve.png"):
        assert (out / name).stat().st_size > 0
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["test"][0]["accuracy"] == metrics["test"][0]["accuracy"]
    assert len(saved["history"][0]) == 2 and 0 <= saved["best_epoch"][0] < 2
    assert 0.0 <= saved["summary"]["accuracy"]["mean"] <= 1.0


def test_eval_reproduces_the_test_metric(trained_run, tiny_store):
    out, metrics = trained_run
    again = evaluate_run(out, tiny_store)
    assert again["accuracy"] == pytest.approx(metrics["test"][0]["accuracy"], abs=1e-6)
    assert again["loss"] == pytest.approx(metrics["test"][0]["loss"], rel=1e-5)  # the checkpoint holds its BN stats


def test_eval_refuses_an_incompatible_store(trained_run, tmp_path):
    out, _ = trained_run
    sines = tmp_path / "sines"
    generate(GenerateOptions(kind="sine-regression", out=str(sines), limit=6, chunk_size=8, steps=2,
                             progress=False), log=lambda *_: None)
    with pytest.raises(StoreError, match="incompatible"):
        evaluate_run(out, sines)


def test_mlp_align_aligns_the_store_once_and_its_run_evaluates(tiny_store, tmp_path):
    """The model's prepare_store hook: one aligned store for every seed and rerun, its reference kept
    in the checkpoint, so that `zoo eval` aligns another store's networks the same way."""
    opts = TrainOptions(store=str(tiny_store), model="mlp-align", epochs=1, lr=1e-3, seeds=2, batch_size=16,
                        hidden_channels=4, augment=False, out=str(tmp_path / "run"), **QUIET)
    lines = []
    metrics = train_run(opts, log=lines.append)
    assert sum("building the MergeMany reference" in line for line in lines) == 1
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data_store"] == str(
        tmp_path / "run" / "aligned-store")
    again = evaluate_run(tmp_path / "run", tiny_store)
    assert again["accuracy"] == pytest.approx(metrics["test"][0]["accuracy"], abs=1e-6)
    assert again["loss"] == pytest.approx(metrics["test"][0]["loss"], rel=1e-5)

    lines.clear()
    rerun = train_run(opts, log=lines.append)  # reuses the aligned store: same networks, same results
    assert not any("MergeMany" in line for line in lines)
    assert rerun["test"] == metrics["test"]


def test_an_aligned_store_is_reused_only_for_the_same_store_and_settings(tiny_store, tmp_path):
    import shutil

    from dws.baselines import AlignedMLP
    from zoo.store import WeightStore

    other = tmp_path / "copy"
    shutil.copytree(tiny_store, other)

    def prepare(store, **kw):
        lines = []
        model = AlignedMLP((2, 32, 32, 1), 10, hidden=8, subsample=8, max_iter=3, **kw)
        aligned = model.prepare_store(WeightStore(store), tmp_path / "run", lines.append)
        assert bool(model.prepared) and not model.align_in_forward
        return aligned, model.reference.clone(), any("MergeMany" in line for line in lines)

    first, reference, built = prepare(tiny_store)
    assert built and first.root == tmp_path / "run" / "aligned-store"
    again, same_reference, built = prepare(tiny_store)
    assert not built and torch.equal(same_reference, reference)
    for store, kw in ((other, {}), (other, {"seed": 1})):  # another store, then other settings: made again
        aligned, _, built = prepare(store, **kw)
        assert built and aligned.manifest["generation"]["derived_from"] == str(other)


def test_an_aligned_store_equals_aligning_the_whole_split_in_memory(tiny_store, tmp_path):
    """prepare_store reads only the reference's subsample and one chunk at a time, and still gives what
    prepare() on the whole train split in memory and align() on every network give."""
    from dws.baselines import AlignedMLP
    from dws.stream.batch import arrays_from_weightspace, weightspace_from_arrays
    from dws.stream.rows import usable_mask
    from zoo.store import WeightStore

    store = WeightStore(tiny_store)
    start, stop = store.split_range("train")
    usable = usable_mask(store, start, stop)
    assert usable.sum() > 8  # so that the reference is a random subsample of the split
    kw = dict(hidden=8, subsample=8, max_iter=3, seed=5)
    streamed = AlignedMLP(store.widths, 10, **kw)
    aligned = streamed.prepare_store(store, tmp_path / "run", log=lambda *_: None)
    in_memory = AlignedMLP(store.widths, 10, **kw)
    in_memory.prepare(weightspace_from_arrays({k: v[usable] for k, v in store.read(start, stop).items()}))
    torch.testing.assert_close(streamed.reference, in_memory.reference, rtol=0, atol=0)
    expected = arrays_from_weightspace(in_memory.align(weightspace_from_arrays(store.read(0, store.num_networks))))
    for name, values in aligned.read(0, aligned.num_networks).items():
        np.testing.assert_allclose(values, expected[name], rtol=1e-6, atol=1e-7)
    assert aligned.networks.select(store.networks.column_names).to_pandas().equals(store.networks.to_pandas())  # NaNs equal


@pytest.mark.parametrize("epochs", [2, 3, 7, 40])
def test_curves_count_epochs_from_one_on_integer_ticks(epochs):
    import matplotlib.pyplot as plt

    from dws.tasks.rundir import curve_figure

    history = [{"epoch": e, "train_loss": 1.0 / (e + 1), "val_accuracy": e / epochs} for e in range(epochs)]
    fig = curve_figure([history, history[: epochs - 1]], "accuracy")
    fig.canvas.draw()
    for ax in fig.axes:
        assert list(ax.lines[0].get_xdata()) == list(range(1, epochs + 1))
        shown = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert shown and all(float(t).is_integer() for t in shown), shown
    assert fig.axes[1].get_ylabel() == "val accuracy"
    plt.close(fig)


class _Batch:
    def __init__(self, ws):
        self.ws = ws

    def __len__(self):
        return len(self.ws)


class _NormThenDrop(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(3, momentum=0.3)
        self.drop = torch.nn.Dropout(0.5)
        self.seen = []

    def forward(self, x):
        self.seen.append(self.drop(x))
        return self.norm(self.seen[-1])


def test_recalibrate_batchnorm_sets_exact_statistics_with_dropout_off():
    torch.manual_seed(0)
    model = _NormThenDrop().train()
    model.norm.running_mean.fill_(123.0)  # stale statistics must not leak into the new ones
    batches = [torch.randn(8, 3) * (i + 1) + i for i in range(5)]
    assert recalibrate_batchnorm(model, [_Batch(b) for b in batches], "cpu")
    assert all(torch.equal(seen, b) for seen, b in zip(model.seen, batches))  # dropout was off
    expected_mean = torch.stack([b.mean(0) for b in batches]).mean(0)
    expected_var = torch.stack([b.var(0) for b in batches]).mean(0)
    torch.testing.assert_close(model.norm.running_mean, expected_mean)
    torch.testing.assert_close(model.norm.running_var, expected_var)
    assert model.norm.momentum == 0.3 and model.training and model.norm.training
    assert not recalibrate_batchnorm(torch.nn.Linear(3, 3), [_Batch(batches[0])], "cpu")


def test_nt_xent_prefers_matching_views():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(16, 8, generator=g)
    aligned = nt_xent(z, z + 0.01 * torch.randn(16, 8, generator=g))
    shuffled = nt_xent(z, z[torch.randperm(16, generator=g)])
    assert aligned < shuffled
    assert np.isfinite(aligned.item())


MALLOC_SCRIPT = """
import ctypes, sys, torch
from dws.tasks.allocator import retain_freed_memory
class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
if not hasattr(libc, "mallinfo2") or (sys.argv[1] == "on" and not retain_freed_memory()):
    print(-1); raise SystemExit
libc.mallinfo2.restype = Mallinfo2
before = libc.mallinfo2()
blocks = [torch.empty(mib << 18).fill_(1.0) for mib in (12, 6, 20)]  # a step's large buffers
during = libc.mallinfo2()
del blocks
after = libc.mallinfo2()
print(during.hblks - before.hblks, (after.fordblks - before.fordblks) >> 20)
"""


def test_retain_freed_memory_reuses_large_blocks():
    """With it, multi-megabyte blocks come from the heap and stay there when freed (for the next
    step to reuse without page faults) instead of being mapped and unmapped each time. Counted
    with glibc's ``mallinfo2`` rather than page faults: the fault counts of one process vary
    between runs (3,072 to 13,312 with it, 16,600 to 26,100 without), which made an earlier
    fault-count version of this test fail now and then."""
    import subprocess
    import sys

    def blocks(mode: str) -> list[int]:
        out = subprocess.run([sys.executable, "-c", MALLOC_SCRIPT, mode], capture_output=True, text=True, check=True)
        return [int(v) for v in out.stdout.split()]

    on = blocks("on")
    if on == [-1]:
        pytest.skip("not glibc >= 2.33")
    mapped, kept = on
    # no mapped block; the 38 MiB kept in the heap after the free (37 when the blocks reused a few
    # bytes that were already free before: the count is rounded down to MiB)
    assert mapped == 0 and kept >= 37
    mapped, kept = blocks("off")  # glibc's default (3 and 0 here; its threshold adapts to past frees)
    assert mapped >= 1 and kept < 37


@pytest.mark.parametrize("backend, fused", [("plain", False), ("pytorch", True)])
def test_backend_option_decides_how_the_dwsnet_runs(backend, fused):
    """`zoo train --backend` reaches dws.nn.fast.accelerate: plain modules, or fused ones (same function)."""
    from dws.nn.fast import describe
    from dws.tasks.models import build_model

    model, _ = build_model("dwsnet", (2, 8, 8, 1), 3, hidden_channels=8, num_layers=2, backend=backend)
    kinds = describe(model)
    assert bool(kinds) == fused
    assert all("(pytorch)" in k for k in kinds.values())


@pytest.mark.parametrize("model", ["dwsnet", "mlp"])
def test_a_final_batch_of_one_network_is_skipped_not_a_crash(tiny_store, tmp_path, model):
    """9 train networks in batches of 8 leave one network: a baseline's batch norm cannot normalize a batch
    of one, so that batch is skipped (it crashed the run before), in training and in the precise-BN pass."""
    metrics = train_run(TrainOptions(store=str(tiny_store), model=model, epochs=1, lr=1e-3, batch_size=8,
                                     train_limit=9, precise_bn=9, hidden_channels=4, num_layers=2,
                                     out=str(tmp_path / "run"), progress=False), log=lambda *_: None)
    assert 0.0 <= metrics["summary"]["accuracy"]["mean"] <= 1.0


def steps_taken(opts: TrainOptions, monkeypatch) -> list[int]:
    """Optimizer steps after each epoch of ``opts``' training (from its checkpoints)."""
    from dws.tasks.checkpoint import Checkpoint

    real, steps = Checkpoint.save, []

    def save(self, objects, values):
        real(self, objects, values)
        steps.append(values["steps"])

    monkeypatch.setattr(Checkpoint, "save", save)
    train_run(opts, log=lambda *_: None)
    monkeypatch.undo()
    return steps


@pytest.mark.parametrize("model", MODELS)
def test_every_model_trains_on_batches_of_one_or_is_refused_in_one_line(tiny_store, tmp_path, monkeypatch, model):
    """A model without batch norm takes a step on every network at --batch-size 1 (the generalization
    column trains ng-transformer and scalegmn-b so: before, every batch of one was skipped, and the run
    ended with a NaN training loss and an untrained model); one with batch norm is refused before any
    work."""
    from dws.tasks.models import build_model
    from dws.tasks.trainer import batch_norms

    opts = TrainOptions(store=str(tiny_store), model=model, epochs=2, lr=1e-3, batch_size=1, train_limit=5,
                        hidden_channels=4, num_layers=2, precise_bn=0, out=str(tmp_path / "run"), progress=False)
    built, _ = build_model(model, (2, 8, 8, 1), 10, hidden_channels=4, num_layers=2, activation="sine")
    if batch_norms(built):
        with pytest.raises(ValueError, match=f"--batch-size 1: --model {model} --task classify has batch norm, "
                                             f"which takes its statistics over the batch"):
            train_run(opts, log=lambda *_: None)
        assert not (tmp_path / "run").exists()
        return
    assert steps_taken(opts, monkeypatch) == [5, 10]
    history = json.loads((tmp_path / "run" / "metrics.json").read_text())["history"][0]
    assert all(np.isfinite(epoch["train_loss"]) for epoch in history)


def test_ssl_at_batches_of_one_is_refused_even_without_batch_norm(tiny_store, tmp_path):
    """NT-Xent on one network has no negatives: its loss is 0 and nothing trains."""
    opts = TrainOptions(store=str(tiny_store), model="nfn-np", task="ssl", target="label", epochs=1, lr=1e-3,
                        batch_size=1, hidden_channels=4, precise_bn=0, out=str(tmp_path / "run"), progress=False)
    with pytest.raises(ValueError, match="--batch-size 1: --model nfn-np --task ssl trains with NT-Xent, which needs "
                                         "other networks of the batch as negatives"):
        train_run(opts, log=lambda *_: None)
    assert not (tmp_path / "run").exists()


def test_an_epoch_that_trains_nothing_is_an_error_not_a_nan_loss(tiny_store, tmp_path):
    """The trainer's own guard, for a batch norm model given batches of one past the option checks."""
    from dws.tasks.objectives import get_task
    from dws.tasks.models import build_model
    from dws.tasks.trainer import TrainConfig, train

    model, _ = build_model("mlp", (2, 32, 32, 1), 10, hidden_channels=4, num_layers=2)
    loader = WeightStoreLoader(tiny_store, "train", batch_size=1)
    loaders = {"train": loader, "val": WeightStoreLoader(tiny_store, "val", batch_size=8, shuffle=False),
               "test": WeightStoreLoader(tiny_store, "test", batch_size=8, shuffle=False)}
    with pytest.raises(ValueError, match="epoch 1: no batch was trained on: the model trains on batches of 2 or "
                                         "more networks \\(it has batch norm, which takes its statistics over"):
        train(model, get_task("classify"), loaders, TrainConfig(epochs=1, progress=False))


def test_train_views_trains_on_k_views_and_evaluates_on_the_first(three_view_store, tmp_path):
    """--train-views K: the multi-view table's rows from one store; every K sees the same val/test networks."""
    from dws.tasks.prepare import prepare_run

    opts = TrainOptions(store=str(three_view_store), epochs=1, lr=1e-3, batch_size=8, hidden_channels=4,
                        num_layers=2, precise_bn=0, train_views=2, out=str(tmp_path / "run"), progress=False)
    loaders = prepare_run(opts, log=lambda *_: None).loaders(seed=0)
    items = {s: WeightStore(three_view_store).manifest["splits"][s]["items"] for s in ("train", "val", "test")}
    assert loaders["train"].num_networks == 2 * items["train"]
    assert loaders["val"].num_networks == items["val"] and loaders["test"].num_networks == items["test"]
    metrics = train_run(opts, log=lambda *_: None)
    assert 0.0 <= metrics["summary"]["accuracy"]["mean"] <= 1.0
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["options"]["train_views"] == 2
    with pytest.raises(StoreError, match=r"holds 3 view\(s\)"):
        train_run(TrainOptions(**{**vars(opts), "train_views": 4, "out": str(tmp_path / "run4")}), log=lambda *_: None)
    with pytest.raises(ValueError, match="--train-views"):
        train_run(TrainOptions(**{**vars(opts), "train_views": 0, "out": str(tmp_path / "run0")}), log=lambda *_: None)
    assert not (tmp_path / "run4").exists()  # refused before anything was written


def test_the_work_between_epochs_shows_on_the_progress_bar(tiny_store, tmp_path, capfd):
    """Batch-norm re-estimation and validation get bars of their own (they sat still ~25 s between
    the demo's epochs)."""
    train_run(TrainOptions(store=str(tiny_store), model="dwsnet", epochs=1, lr=1e-3, batch_size=16,
                           hidden_channels=4, precise_bn=40, out=str(tmp_path / "run"), progress=True),
              log=lambda *_: None)
    err = capfd.readouterr().err
    assert "epoch 1: batch-norm statistics" in err and "epoch 1: validation" in err


def test_a_diverging_lr_candidate_is_left_out_of_the_search():
    """The lr search goes on past a candidate whose loss turns non-finite (recorded as None, said in a
    line) and picks among the rest; only if every candidate diverges is the run refused, in one line."""
    from dws.tasks.protocol import run_protocol
    from dws.tasks.objectives import get_task
    from dws.tasks.trainer import TrainConfig, TrainResult

    task = get_task("classify", None)
    vals = {5e-3: None, 1e-3: 0.6, 5e-4: 0.7, 1e-4: 0.5}  # None: diverges

    def fit(config):
        if vals[config.lr] is None:
            raise FloatingPointError("epoch 3: training loss is nan; lower the learning rate")
        return TrainResult(best_epoch=0, best_val={"accuracy": vals[config.lr]}, test={"accuracy": vals[config.lr]})

    lines = []
    out = run_protocol(fit, task, TrainConfig(epochs=1, lr=1e-3, seed=0), lrs=tuple(vals), seeds=1, log=lines.append)
    assert out["lr"] == 5e-4 and out["lr_search"] == {"0.005": None, "0.001": 0.6, "0.0005": 0.7, "0.0001": 0.5}
    assert any(line.startswith("lr 0.005: diverged (epoch 3: training loss is nan") for line in lines)
    vals.update(dict.fromkeys(vals))  # every candidate diverges
    with pytest.raises(ValueError, match=r"every candidate learning rate \(0.005, 0.001, 0.0005, 0.0001\) diverged"):
        run_protocol(fit, task, TrainConfig(epochs=1, lr=1e-3, seed=0), lrs=tuple(vals), seeds=1, log=lines.append)


def test_a_val_tie_keeps_the_grids_earlier_candidate():
    """A later candidate must be strictly better on val to replace the chosen lr: ScaleGMN's Fashion-MNIST
    ci cell tied at 5e-4 and 1e-4 (291 of 417 val INRs each) and trains its full cell at 5e-4
    (docs/train.md). Both directions: a metric to maximize (accuracy) and one to minimize (MSE)."""
    from dws.tasks.protocol import run_protocol
    from dws.tasks.objectives import get_task
    from dws.tasks.trainer import TrainConfig, TrainResult

    for task, vals in ((get_task("classify", None), {5e-3: 0.3, 1e-3: 0.6, 5e-4: 0.7, 1e-4: 0.7}),
                       (get_task("regress", "test_accuracy"), {5e-3: 0.3, 1e-3: 0.2, 5e-4: 0.1, 1e-4: 0.1})):
        def fit(config, vals=vals, task=task):
            return TrainResult(best_epoch=0, best_val={task.metric: vals[config.lr]}, test={task.metric: 0.0})

        out = run_protocol(fit, task, TrainConfig(epochs=1, lr=1e-3, seed=0), lrs=tuple(vals), seeds=1,
                           log=lambda *_: None)
        assert out["lr"] == 5e-4, task.metric


class NonFiniteAfter:
    """A task whose training loss turns NaN after ``steps`` steps (the real task otherwise)."""

    def __init__(self, task, steps: int):
        self.task, self.left = task, steps

    def __getattr__(self, name):
        return getattr(self.task, name)

    def loss(self, *args):
        self.left -= 1
        loss = self.task.loss(*args)
        return loss * float("nan") if self.left < 0 else loss


def test_a_diverged_candidate_is_recorded_counted_and_not_trained_again(tiny_store, tmp_path):
    """The real loop's divergence (lr 5e-3 turns NaN in its second epoch): the candidate's checkpoint holds
    what it did, its seconds are in ``training_seconds``, and a rerun does not train it again."""
    from dws.tasks.prepare import prepare_run
    from dws.tasks.protocol import fit_run
    from dws.tasks.trainer import train

    opts = TrainOptions(store=str(tiny_store), model="dwsnet", epochs=2, lr=None, batch_size=16, hidden_channels=4,
                        out=str(tmp_path / "run"), **QUIET)
    trained = []

    def train_fn(model, task, loaders, config, **kw):
        trained.append(config.lr)
        if config.lr == 5e-3:
            task = NonFiniteAfter(task, steps=len(loaders["train"]))  # the first step of epoch 2
        return train(model, task, loaders, config, **kw)

    lines = []
    first = fit_run(prepare_run(opts, lines.append), lines.append, train_fn=train_fn)
    assert trained == [5e-3, 1e-3, 5e-4, 1e-4] and first["lr_search"]["0.005"] is None
    assert any(line.startswith("lr 0.005: diverged (epoch 2: training loss is nan") for line in lines), lines
    kept = sum(r.seconds for r in first["results"])
    assert first["training_seconds"] > kept  # the other candidates' and the diverged one's too
    assert first["training_epochs"] == 1 + 3 * 2  # the diverged candidate completed one of its two epochs
    saved = torch.load(tmp_path / "run" / "checkpoints" / "lr0.005-seed0.pt", weights_only=False)
    assert saved["status"] == "finished" and len(saved["outcome"]["history"]) == 1
    assert saved["outcome"]["seconds"] > 0

    lines.clear()
    again = fit_run(prepare_run(opts, lines.append), lines.append, train_fn=train_fn)
    assert trained == [5e-3, 1e-3, 5e-4, 1e-4]  # nothing trained again, the diverged candidate included
    assert "lr 0.005, seed 0: diverged before the interruption, not trained again" in lines
    assert again["lr_search"] == first["lr_search"] and again["training_seconds"] == first["training_seconds"]
    assert again["training_epochs"] == first["training_epochs"]
