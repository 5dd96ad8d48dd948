"""--max-memory's former gaps: the model's activations (counted, and a bound of a training's peak RSS),
`zoo eval --out`'s chunks and images, Ray workers sharing one budget, and runs checkpointed before
--max-memory and --normalize existed resuming with the values they began with."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cli import main
from dws.stream.memory import activation_bytes, network_bytes, plan_memory, worker_budget
from dws.stream.synthetic import write_synthetic_store
from dws.tasks.checkpoint import CHECKPOINTS, SETTINGS, CheckpointError
from dws.tasks.models import build_model
from dws.tasks.options import ACTIVATION_PEAK, MODELS, TrainOptions
from dws.tasks.prepare import prepare_run
from dws.tasks.run import train_run
from zoo.options import DEFAULT_MAX_MEMORY, RUNTIME_BYTES, format_size
from zoo.store import WeightStore

from test_resume import interrupted, without_seconds  # a kill right after a checkpoint write

ROOT = Path(__file__).resolve().parent.parent
QUIET = dict(log=lambda *_: None)
MiB = 2**20


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """256 random (2, 32, 32, 1) networks in chunks of 32: splits 204/26/26."""
    root = tmp_path_factory.mktemp("gaps") / "synth"
    return WeightStore(write_synthetic_store(root, widths=(2, 32, 32, 1), num_networks=256, chunk_size=32, seed=3))


def dwsnet(store, out, **kw) -> TrainOptions:
    return TrainOptions(**{**dict(store=str(store.root), model="dwsnet", hidden_channels=4, num_layers=2, epochs=2,
                                  lr=1e-3, batch_size=16, precise_bn=0, progress=False, out=str(out), backend="plain"),
                           **kw})


# ------------------------------------------------------------------------------ activations
def random_architecture(generator: torch.Generator) -> tuple[int, ...]:
    depth = int(torch.randint(1, 4, (), generator=generator))
    return (2, *torch.randint(3, 12, (depth,), generator=generator).tolist(), 1)


def test_activations_scale_with_batch_and_width_and_leave_the_model_untouched():
    generator = torch.Generator().manual_seed(7)
    for _ in range(3):
        widths = random_architecture(generator)
        model, _ = build_model("dwsnet", widths, 3, hidden_channels=8, num_layers=2, bn=True, dropout=0.5,
                               backend="plain")
        model.eval()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        rng = torch.get_rng_state()
        one = activation_bytes(model, widths, 16, 2.0)
        # the probe leaves the model (BN statistics, eval mode) and the global generator as they were
        assert not model.training and torch.equal(torch.get_rng_state(), rng)
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
        assert one > 0 and activation_bytes(model, widths, 64, 2.0) == pytest.approx(4 * one, rel=1e-6)
        assert activation_bytes(model, widths, 16, 1.0) == pytest.approx(one / 2, rel=1e-6)
        assert activation_bytes(model, widths, 16, 2.0, forwards=2) == pytest.approx(2 * one, rel=1e-6)
        wider, _ = build_model("dwsnet", widths, 3, hidden_channels=32, num_layers=2, bn=True, dropout=0.5,
                               backend="plain")
        assert activation_bytes(wider, widths, 16, 2.0) > 3 * one  # per-weight features: ~linear in the channels


def test_the_plan_counts_activations_and_refuses_a_budget_without_room_for_them(synth, tmp_path):
    opts = dwsnet(synth, tmp_path / "run", hidden_channels=16, batch_size=64)
    plan = prepare_run(opts, **QUIET).memory
    counted = plan.fixed["activations of 64"]
    model, _ = build_model("dwsnet", synth.widths, 10, hidden_channels=16, num_layers=2, backend="plain")
    assert counted == activation_bytes(model, synth.widths, 64, ACTIVATION_PEAK["dwsnet"][0]) > 10 * MiB
    assert f"activations of 64 {format_size(counted)}" in plan.describe()
    least = sum(plan.fixed.values())  # with the train split streamed: a window of one chunk more
    with pytest.raises(ValueError, match=r"activations of 64") as refused:
        prepare_run(replace(opts, max_memory=least - 1), **QUIET)
    assert "\n" not in str(refused.value) and "needs at least" in str(refused.value)
    # on an accelerator they are not in host memory: planned all the same (the data order does not
    # depend on the device), but not refused for
    budget = least - counted + 3 * synth.chunk_size * network_bytes(synth)
    common = dict(shuffled="train", batch_size=64, model_bytes=0, training=True, activations=counted)
    device_plan = plan_memory(budget, synth, {"train": 204}, activations_on_host=False, **common)
    assert not device_plan.splits["train"].in_memory and device_plan.splits["train"].buffer_chunks == 1
    with pytest.raises(ValueError, match="activations of 64"):
        plan_memory(budget, synth, {"train": 204}, activations_on_host=True, **common)
    assert not (tmp_path / "run").exists()


PEAK_RSS = """
import sys
from cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    # VmHWM, this process's own peak: ru_maxrss would start from the forking parent's (pytest's) size
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print("peak-rss", int(hwm.split()[1]) * 1024, flush=True)
"""


def peak_rss_of_training(store, out: Path, channels: int, layers: int, budget: int) -> int:
    """Peak RSS of ``zoo train`` (a DWSNet, batches of 204: the whole train split) in its own process."""
    argv = ["train", str(store.root), "--model", "dwsnet", "--hidden-channels", str(channels), "--num-layers",
            str(layers), "--epochs", "1", "--lr", "1e-3", "--batch-size", "204", "--precise-bn", "0", "--backend",
            "plain", "--out", str(out), "--max-memory", str(budget)]
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, *argv], cwd=ROOT, capture_output=True, text=True,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return int(done.stdout.split("peak-rss")[-1])


def test_a_training_heavy_in_activations_grows_by_no_more_than_they_count(synth, tmp_path):
    """The same training with a DWSNet of 2 channels and one of 24 channels and 4 layers, whose activations
    outweigh everything but the runtime, each in its own process at exactly its accounted peak: the
    heavy one holds more by no more than the difference of the counted activations (and model), and by
    more than a third of it (the count is not a blanket margin)."""
    runs = {}
    for channels, layers in ((2, 2), (24, 4)):
        opts = dwsnet(synth, tmp_path / f"run{channels}", hidden_channels=channels, num_layers=layers,
                      batch_size=204, epochs=1)
        plan = prepare_run(opts, **QUIET).memory
        assert all(split.in_memory for split in plan.splits.values())
        runs[channels] = (plan, peak_rss_of_training(synth, tmp_path / f"run{channels}", channels, layers, plan.peak))
    (light, light_peak), (heavy, heavy_peak) = runs[2], runs[24]
    counted = heavy.peak - light.peak
    assert heavy.fixed["activations of 204"] > 256 * MiB
    assert counted / 3 < heavy_peak - light_peak <= counted, (
        f"{format_size(heavy_peak - light_peak)} more held, {format_size(counted)} more counted")


@pytest.mark.slow
@pytest.mark.parametrize("name", [m for m in MODELS if m != "mlp-align"])  # (mlp-align: the MLP's)
def test_each_models_measured_step_stays_within_its_counted_activations(name):
    """ACTIVATION_PEAK's factors: one training step's and one no-grad forward's peak RSS growth, each in
    a fresh process, within activation_bytes."""
    batch = 64 if name.startswith(("ng-", "scalegmn")) else 256
    for training in (True, False):
        done = subprocess.run([sys.executable, "-c", STEP, name, str(batch), str(int(training))], cwd=ROOT,
                              capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
                              timeout=600)
        assert done.returncode == 0, done.stderr
        grown, counted = map(int, done.stdout.split())
        assert grown <= counted, f"{name} {'training' if training else 'evaluating'}: {grown} > {counted} bytes"


STEP = """
import gc, resource, sys, torch
from dws.stream.memory import activation_bytes
from dws.tasks.models import build_model
from dws.tasks.options import ACTIVATION_PEAK
from dws.weightspace import WeightSpace
name, batch, training = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
widths = (2, 16, 16, 1)
model, _ = build_model(name, widths, 10, activation="sine")
counted = activation_bytes(model, widths, batch, ACTIVATION_PEAK[name][0 if training else 1])
ws = WeightSpace(tuple(torch.randn(batch, o, i) for i, o in zip(widths, widths[1:])),
                 tuple(torch.randn(batch, o) for o in widths[1:]))
gc.collect()
before = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
if training:
    out = model.train()(ws)
    (out if isinstance(out, torch.Tensor) else sum(w.sum() for w in out.weights)).float().sum().backward()
else:
    with torch.no_grad():
        model.eval()(ws)
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))  # (not ru_maxrss: the parent's)
print(int(hwm.split()[1]) * 1024 - before, counted)
"""


# ------------------------------------------------------------------------------ Ray workers
def test_workers_share_one_budget_after_the_drivers_runtime(synth, tmp_path):
    budget = 8 * 2**30
    opts = dwsnet(synth, tmp_path / "run", batch_size=30, max_memory=budget)
    alone = prepare_run(opts, **QUIET).memory
    for workers in (2, 3, 5):
        lines = []
        plan = prepare_run(replace(opts, workers=workers), log=lines.append).memory
        assert plan.total == budget and plan.sharers == workers and plan.budget == worker_budget(budget, workers)
        assert RUNTIME_BYTES + workers * plan.budget <= budget < RUNTIME_BYTES + workers * (plan.budget + 1)
        assert plan.peak <= plan.budget
        # each worker runs its model on its rows of a batch: ceil(30 / N) networks' activations
        rows = math.ceil(30 / workers)
        assert plan.fixed[f"activations of 30"] == pytest.approx(alone.fixed["activations of 30"] * rows / 30, rel=1e-6)
        assert any(f"of each of {workers} workers of --max-memory 8.0 GiB" in line for line in lines), lines
    # a budget one process could use but 4 workers cannot is refused in one line, saying the whole minimum
    least = sum(alone.fixed.values()) + synth.chunk_size * network_bytes(synth)  # a window of one chunk
    assert prepare_run(replace(opts, max_memory=least), **QUIET).memory.peak <= least
    with pytest.raises(ValueError, match="on 4 workers needs at least") as refused:
        prepare_run(replace(opts, workers=4, max_memory=least), **QUIET)
    assert "the driver's runtime" in str(refused.value) and "4 x the runtime" in str(refused.value)


# ------------------------------------------------------------------------------ old checkpoints
def test_a_run_checkpointed_before_the_options_existed_resumes_to_the_uninterrupted_result(synth, tmp_path,
                                                                                            monkeypatch):
    """Its saved settings lack --normalize and --max-memory: it resumes with entry normalization (as it
    began, though a DWSNet's default is now orbit) and the default budget, said in one line."""
    began = dwsnet(synth, tmp_path / "reference", normalize="entry", dropout=0.1)
    reference = train_run(began, **QUIET)
    old = replace(began, out=str(tmp_path / "old"))
    interrupted(old, monkeypatch, 1)
    settings_path = tmp_path / "old" / CHECKPOINTS / SETTINGS
    settings = json.loads(settings_path.read_text())
    for flag in ("--normalize", "--max-memory"):
        del settings[flag]
    settings_path.write_text(json.dumps(settings))

    lines = []  # the command as typed today: no --normalize (orbit for a DWSNet), another budget
    resumed = train_run(replace(old, normalize=None, max_memory=2 * DEFAULT_MAX_MEMORY), log=lines.append)
    notes = [line for line in lines if "saved before" in line]
    assert len(notes) == 1 and "--normalize entry" in notes[0] and "--max-memory 4.0 GiB" in notes[0], lines
    assert "resuming lr 0.001, seed 0 after epoch 1 of 2" in lines
    assert without_seconds(resumed) == without_seconds(reference)
    config = torch.load(tmp_path / "old" / "best.pt", weights_only=False)["config"]["options"]
    assert config["normalize"] == "entry" and config["max_memory"] == DEFAULT_MAX_MEMORY


def test_a_run_saved_with_the_options_is_still_refused_other_values(synth, tmp_path, monkeypatch):
    opts = dwsnet(synth, tmp_path / "run", normalize="entry")
    interrupted(opts, monkeypatch, 1)
    lines = []
    with pytest.raises(CheckpointError, match="--normalize: unfinished run 'entry', now 'orbit'"):
        train_run(replace(opts, normalize=None), log=lines.append)
    assert not any("saved before" in line for line in lines)


# ------------------------------------------------------------------------------ zoo eval --out
@pytest.fixture(scope="module")
def adapt_run(pair_store, tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "adapt"
    result = CliRunner().invoke(main, ["train", str(pair_store), "--task", "adapt", "--out", str(run), "--epochs", "1",
                                       "--batch-size", "4", "--lr", "1e-3", "--hidden-channels", "2", "--num-layers",
                                       "1", "--image-batch", "8", "--precise-bn", "0"])
    assert result.exit_code == 0, result.output
    return run


def test_an_adapted_store_is_written_within_a_budget_that_holds_its_chunks_and_images(adapt_run, pair_store,
                                                                                       tmp_path):
    from dws.tasks.adapted_store import adaptation_bytes
    from dws.tasks.rundir import load_run

    store = WeightStore(pair_store)
    adaptation = load_run(adapt_run).bind(store).adaptation
    parts = adaptation_bytes(adaptation, store)
    data = adaptation.domain.data
    assert parts["images"] >= data.train_pixels.nbytes + data.test_pixels.nbytes + 2 * 4 * data.test_pixels.size
    # pairs of classes: each of a chunk's class sets selects its two classes' test images once
    assert 0 < parts["a chunk's class sets' images"] <= 4 * data.test_pixels.size * store.chunk_size
    runner = CliRunner()
    out = tmp_path / "adapted"
    refused = runner.invoke(main, ["eval", str(adapt_run), str(pair_store), "--out", str(out), "--max-memory", "520M"])
    assert refused.exit_code == 2 and not out.exists(), refused.output
    error = [line for line in refused.output.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "needs at least" in error[0], refused.output
    assert all(f"{part} " in error[0] for part in ("the runtime", "activations of 4", *parts)), error[0]
    done = runner.invoke(main, ["eval", str(adapt_run), str(pair_store), "--out", str(out), "--max-memory", "2G"])
    assert done.exit_code == 0 and WeightStore(out).num_networks == store.num_networks, done.output
