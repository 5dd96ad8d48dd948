"""``zoo train`` survives interruption: a rerun continues after the last completed epoch and ends
with the metrics of an uninterrupted run; other settings are refused; checkpoints are atomic."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import dws.tasks.checkpoint as checkpoint_module
from cli import main
from dws.stream import WeightStoreLoader
from dws.tasks.checkpoint import (
    Checkpoint,
    CheckpointError,
    capture,
    global_random_state,
    restore,
    set_global_random_state,
)
from dws.tasks.options import TrainOptions
from dws.tasks.prepare import resume_settings
from dws.tasks.run import train_run
from zoo.store import WeightStore

ROOT = Path(__file__).resolve().parent.parent
# dropout (the global torch generator), augmentation (the loader's generators) and re-estimated BN
# statistics (a second, shuffled loader): every random source a training has
COMMON = dict(model="dwsnet", epochs=3, lr=1e-3, seeds=2, batch_size=16, hidden_channels=8, dropout=0.1,
              precise_bn=16, progress=False)


class Interrupted(BaseException):
    """What a kill does to the training: it stops between two statements."""


def interrupt_after(monkeypatch, saves: int) -> None:
    """Stop the process's trainings right after their ``saves``-th checkpoint write."""
    real, count = Checkpoint.save, [0]

    def save(self, objects, values):
        real(self, objects, values)
        count[0] += 1
        if count[0] == saves:
            raise Interrupted

    monkeypatch.setattr(Checkpoint, "save", save)


def interrupted(opts: TrainOptions, monkeypatch, saves: int) -> None:
    """Train ``opts`` until its ``saves``-th checkpoint, as a kill right after that write would."""
    interrupt_after(monkeypatch, saves)
    with pytest.raises(Interrupted):
        train_run(opts, log=lambda *_: None)
    monkeypatch.undo()


def without_seconds(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in ("seconds", "training_seconds", "run_dir")}


def best_state(run_dir: Path) -> dict:
    return torch.load(run_dir / "best.pt", weights_only=False)["state_dict"]


@pytest.fixture(scope="module")
def uninterrupted(tiny_store, tmp_path_factory):
    """The reference: the same settings trained without a stop, for fixed-lr and lr-search runs."""
    out = tmp_path_factory.mktemp("reference")
    runs = {}
    for name, options in {"fixed": COMMON, "search": {**COMMON, "lr": None, "seeds": 1, "epochs": 2}}.items():
        opts = TrainOptions(store=str(tiny_store), out=str(out / name), **options)
        runs[name] = (opts, train_run(opts, log=lambda *_: None))
    return runs


@pytest.mark.parametrize("name, saves, resumed, reused", [
    ("fixed", 4, "resuming lr 0.001, seed 1 after epoch 1 of 3", ["lr 0.001, seed 0"]),
    ("search", 3, "resuming lr 0.001, seed 0 after epoch 1 of 2", ["lr 0.005, seed 0"]),
])
def test_an_interrupted_run_resumes_to_the_uninterrupted_result(uninterrupted, tmp_path, monkeypatch, name, saves,
                                                                 resumed, reused):
    opts, reference = uninterrupted[name]
    opts = replace(opts, out=str(tmp_path / "run"))
    interrupted(opts, monkeypatch, saves)
    assert not (tmp_path / "run" / "metrics.json").exists()
    torch.manual_seed(1234), np.random.seed(5), random.seed(6)  # whatever the generators hold now is replaced

    lines = []
    metrics = train_run(opts, log=lines.append)
    assert resumed in lines
    for label in reused:  # finished trainings are not trained again
        assert any(line.startswith(f"{label}: finished before the interruption") for line in lines), lines
    assert sum(line.startswith("resuming lr") for line in lines) == 1
    assert without_seconds(metrics) == without_seconds(reference)
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["history"] == reference["history"]
    for key, value in best_state(Path(reference["run_dir"])).items():
        assert torch.equal(value, best_state(tmp_path / "run")[key]), key
    assert not (tmp_path / "run" / "checkpoints").exists()  # a finished run leaves nothing to resume


def test_a_run_stopped_early_is_not_trained_on_after_resuming(tiny_store, tmp_path, monkeypatch):
    """Killed right after the checkpoint of the epoch that triggered --patience: nothing more to train."""
    opts = TrainOptions(store=str(tiny_store), out=str(tmp_path / "reference"), **{**COMMON, "seeds": 1, "epochs": 8,
                                                                                   "patience": 1})
    reference = train_run(opts, log=lambda *_: None)
    stopped_after = len(reference["history"][0])
    assert stopped_after < 8, "the reference must stop early for this test"
    opts = replace(opts, out=str(tmp_path / "run"))
    interrupted(opts, monkeypatch, stopped_after)
    lines = []
    metrics = train_run(opts, log=lines.append)
    assert f"resuming lr 0.001, seed 0 after epoch {stopped_after} of 8" in lines
    assert without_seconds(metrics) == without_seconds(reference)


def test_a_killed_process_resumes_to_the_same_metrics(uninterrupted, tmp_path):
    """SIGKILL mid-training (no chance to clean up), then the same command again."""
    opts, reference = uninterrupted["fixed"]
    out = tmp_path / "run"
    command = [sys.executable, "-m", "cli", "train", opts.store, "--out", str(out), "--epochs", "3", "--lr", "1e-3",
               "--seeds", "2", "--batch-size", "16", "--hidden-channels", "8", "--dropout", "0.1",
               "--precise-bn", "16"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the tests' thread count: the same float rounding
    victim = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    second = out / "checkpoints" / "lr0.001-seed1.pt"  # exists once seed 1's first epoch is saved
    while not second.exists():
        assert victim.poll() is None, "the run ended before it could be killed"
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    saved = torch.load(second, weights_only=False)
    assert saved["status"] == "training" and 1 <= saved["values"]["epoch"] < 3  # killed mid-training

    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "lr 0.001, seed 0: finished before the interruption" in again.stdout
    assert f"resuming lr 0.001, seed 1 after epoch {saved['values']['epoch']} of 3" in again.stdout
    assert_same_metrics(out, reference)


def assert_same_metrics(out: Path, reference: dict) -> None:
    """``out``'s metrics.json against ``reference``'s metrics up to another process's float rounding."""
    metrics = json.loads((out / "metrics.json").read_text())
    expected = json.loads(json.dumps(without_seconds(reference)))
    assert without_seconds(metrics)["test"] == pytest.approx(expected["test"], rel=1e-5)
    for a, b in zip(metrics["history"], expected["history"], strict=True):
        for x, y in zip(a, b, strict=True):
            assert x == pytest.approx(y, rel=1e-5)
    assert metrics["best_epoch"] == expected["best_epoch"]


def test_other_settings_are_refused_by_name_and_nothing_is_overwritten(tiny_store, tmp_path, monkeypatch):
    out = tmp_path / "run"

    def args(epochs="3", lr="1e-3", *more):
        return ["train", str(tiny_store), "--out", str(out), "--epochs", epochs, "--lr", lr, "--batch-size", "16",
                "--hidden-channels", "8", "--precise-bn", "16", *more]

    interrupted(TrainOptions(store=str(tiny_store), out=str(out), epochs=3, lr=1e-3, batch_size=16, hidden_channels=8,
                             precise_bn=16, progress=False), monkeypatch, 2)
    folder = out / "checkpoints"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    changed = CliRunner().invoke(main, args("4", "5e-4", "--no-augment"))
    assert changed.exit_code == 2
    for line in ("--epochs: unfinished run 3, now 4", "--lr: unfinished run 0.001, now 0.0005",
                 "--augment: unfinished run True, now False", "--restart"):
        assert line in changed.output, changed.output
    assert "--batch-size" not in changed.output  # only what differs
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before

    # what changes only the speed may differ
    faster = CliRunner().invoke(main, args("3", "1e-3", "--loader-workers", "1", "--backend", "pytorch"))
    assert faster.exit_code == 0, faster.output
    assert "resuming lr 0.001, seed 0 after epoch 2 of 3" in faster.output


def test_restart_discards_the_unfinished_run(tiny_store, tmp_path, monkeypatch):
    opts = TrainOptions(store=str(tiny_store), out=str(tmp_path / "run"), epochs=2, lr=1e-3, batch_size=16,
                        hidden_channels=8, progress=False)
    interrupted(opts, monkeypatch, 1)
    result = CliRunner().invoke(main, ["train", str(tiny_store), "--out", opts.out, "--epochs", "3", "--lr", "1e-3",
                                       "--batch-size", "16", "--hidden-channels", "8", "--restart"])
    assert result.exit_code == 0, result.output
    assert "resum" not in result.output
    assert len(json.loads((tmp_path / "run" / "metrics.json").read_text())["history"][0]) == 3


def test_resume_settings_ignore_only_what_changes_speed(tiny_store):
    store = WeightStore(tiny_store)
    opts = TrainOptions(store=str(tiny_store))
    same = replace(opts, progress=False, loader_workers=2, device="cpu", backend="plain", out="elsewhere",
                   resume=False)
    assert resume_settings(same, store) == resume_settings(opts, store)
    for change in (dict(epochs=11), dict(seed=1), dict(workers=2), dict(precise_bn=0), dict(train_limit=20)):
        assert resume_settings(replace(opts, **change), store) != resume_settings(opts, store), change
    assert resume_settings(opts, store)["STORE"] == str(Path(tiny_store).resolve())


def test_a_checkpoint_write_is_all_or_nothing(tmp_path, monkeypatch):
    path = tmp_path / "a.pt"
    checkpoint_module.save_atomically({"epoch": 1}, path)

    def torn_write(obj, f):  # a write that dies halfway (a kill, a full disk)
        f.write(b"PK\x03\x04 half a zip")
        raise OSError("No space left on device")

    monkeypatch.setattr(checkpoint_module.torch, "save", torn_write)
    with pytest.raises(OSError, match="No space"):
        checkpoint_module.save_atomically({"epoch": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=False) == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.pt"]  # no temporary file left behind


def test_a_damaged_checkpoint_is_refused_with_its_name_and_how_to_start_over(tiny_store, tmp_path, monkeypatch):
    opts = TrainOptions(store=str(tiny_store), out=str(tmp_path / "run"), epochs=2, lr=1e-3, batch_size=16,
                        hidden_channels=8, progress=False)
    interrupted(opts, monkeypatch, 1)
    path = tmp_path / "run" / "checkpoints" / "lr0.001-seed0.pt"
    path.write_bytes(path.read_bytes()[:1000])  # truncated, as by a copy cut short
    result = CliRunner().invoke(main, ["train", str(tiny_store), "--out", str(tmp_path / "run"), "--epochs", "2",
                                       "--lr", "1e-3", "--batch-size", "16", "--hidden-channels", "8"])
    assert result.exit_code == 2
    assert str(path) in result.output and "is damaged" in result.output and "--restart" in result.output
    with pytest.raises(CheckpointError, match="delete it to redo lr 0.001, seed 0 from its first epoch"):
        Checkpoint(path, "lr 0.001, seed 0").read()


def test_capture_and_restore_continue_every_random_source(tiny_store):
    """Module, optimizer, a generator, a loader's position and the global generators: after a restore,
    the same steps give the same numbers."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(3)
    loader = WeightStoreLoader(tiny_store, "train", batch_size=16, augment=lambda ws, g: ws.map(
        lambda t: t + torch.randn(t.shape, generator=g)))
    objects = {"model": model, "optimizer": opt, "gen": gen, "loader": loader}

    def steps():
        out = []
        for _ in range(2):
            loss = model(torch.randn(5, 4, generator=gen)).square().mean() + np.random.rand() + random.random()
            opt.zero_grad()
            loss.backward()
            opt.step()
            first = next(iter(loader)).ws.weights[0]
            out.append((loss.item(), first.sum().item(), torch.rand(1).item()))
        return out

    steps()
    states, rng = capture(objects), global_random_state()
    states = torch.load(_saved(states), weights_only=False)  # through a file, as a resume reads it
    first = steps()
    restore(objects, states)
    set_global_random_state(rng)
    assert steps() == first
    with pytest.raises(CheckpointError, match="holds the state of"):
        restore({"model": model}, states)


def _saved(obj):
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def test_a_finished_run_saved_before_newer_options_is_reused_with_the_values_it_was_trained_with(tiny_store,
                                                                                                 tmp_path):
    """A finished run whose config lacks --normalize and --max-memory (written before they existed) was
    trained with per-entry statistics and the default budget: a pipeline asking for exactly that reuses
    it, one asking for orbit statistics (dwsnet's default now) trains anew."""
    from dws.tasks.rundir import finished_run

    opts = TrainOptions(store=str(tiny_store), out=str(tmp_path / "run"), epochs=1, lr=1e-3, batch_size=16,
                        hidden_channels=4, num_layers=1, normalize="entry", progress=False)
    train_run(opts, log=lambda *_: None)
    config_file = tmp_path / "run" / "config.json"
    config = json.loads(config_file.read_text())
    for name in ("normalize", "max_memory"):
        del config["options"][name]
    config_file.write_text(json.dumps(config))
    assert finished_run(opts) is not None
    assert finished_run(replace(opts, normalize=None)) is None  # orbit, dwsnet's default
    assert finished_run(replace(opts, normalize="orbit")) is None
    assert finished_run(replace(opts, max_memory=opts.max_memory // 2 if opts.max_memory else 1 << 30)) is None


def test_a_model_whose_code_version_moved_is_neither_resumed_nor_reused(tiny_store, tmp_path, monkeypatch):
    """dws.tasks.options.MODEL_VERSIONS: a finished run of the model's older code is not reused by the
    pipelines, an unfinished one is refused on resume in one message naming the version (its checkpoints
    kept), and a run begun at the new version resumes as any other."""
    from dws.tasks.checkpoint import CHECKPOINTS
    from dws.tasks.options import MODEL_VERSIONS
    from dws.tasks.rundir import evaluate_run, finished_run

    opts = TrainOptions(store=str(tiny_store), out=str(tmp_path / "done"), epochs=1, lr=1e-3, batch_size=16,
                        hidden_channels=4, num_layers=1, progress=False)
    train_run(opts, log=lambda *_: None)
    assert json.loads((tmp_path / "done" / "config.json").read_text())["model_version"] == 1
    assert finished_run(opts) is not None
    assert "note" not in evaluate_run(tmp_path / "done", tiny_store)
    unfinished = replace(opts, out=str(tmp_path / "unfinished"), epochs=2)
    interrupted(unfinished, monkeypatch, 1)  # at version 1
    again = replace(opts, out=str(tmp_path / "again"), epochs=2)
    MODEL_VERSIONS["dwsnet"] = 2
    try:
        assert finished_run(opts) is None
        note = evaluate_run(tmp_path / "done", tiny_store)["note"]
        assert "trained as dwsnet version 1, rebuilt as version 2" in note
        saved = torch.load(tmp_path / "done" / "best.pt", weights_only=False)  # version 2 renamed a parameter
        saved["state_dict"] = {f"renamed.{k}": v for k, v in saved["state_dict"].items()}
        torch.save(saved, tmp_path / "done" / "best.pt")
        with pytest.raises(ValueError, match=r"trained as dwsnet version 1, whose parameters today's code \(version "
                                             r"2, dws.tasks.options.MODEL_VERSIONS\) cannot load"):
            evaluate_run(tmp_path / "done", tiny_store)
        with pytest.raises(CheckpointError, match="--model version: unfinished run None, now 2"):
            train_run(unfinished, log=lambda *_: None)
        assert list((tmp_path / "unfinished" / CHECKPOINTS).glob("*.pt"))  # nothing lost
        interrupted(again, monkeypatch, 1)  # at version 2
        lines = []
        train_run(again, log=lines.append)
        assert "resuming lr 0.001, seed 0 after epoch 1 of 2" in lines
        assert finished_run(again) is not None
    finally:
        del MODEL_VERSIONS["dwsnet"]


def test_the_reference_recipe_steps_and_resumes_as_one_run(tiny_store, tmp_path, monkeypatch):
    """--warmup-steps, --clip-grad, --amsgrad and --weight-decay reach every optimizer step: the lr rises
    linearly over the warmup (across an epoch boundary), every step's gradients are clipped, AdamW runs
    AMSGrad with the given decay; and a run interrupted inside the warmup resumes it where it was."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    recipe = dict(warmup_steps=5, clip_grad=1e-2, amsgrad=True, weight_decay=1e-3)
    opts = TrainOptions(store=str(tiny_store), out=str(tmp_path / "reference"),
                        **{**COMMON, "seeds": 1, "epochs": 2, **recipe})
    seen = []

    def record(optimizer, args, kwargs):
        group = optimizer.param_groups[0]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for g in optimizer.param_groups
                                                     for p in g["params"] if p.grad is not None]))
        seen.append((group["lr"], float(norm), group["amsgrad"], group["weight_decay"]))

    handle = register_optimizer_step_pre_hook(record)
    try:
        reference = train_run(opts, log=lambda *_: None)
        steps = len(seen)
        assert steps == 6  # two epochs of 3 steps: the warmup ends in the second
        assert [lr for lr, *_ in seen] == pytest.approx([1e-3 * min(1, k / 5) for k in range(1, steps + 1)])
        assert all(norm <= 1e-2 * (1 + 1e-5) for _, norm, *_ in seen)
        assert all(amsgrad and decay == 1e-3 for *_, amsgrad, decay in seen)

        seen.clear()
        resumed_opts = replace(opts, out=str(tmp_path / "run"))
        interrupted(resumed_opts, monkeypatch, saves=1)  # after epoch 1, inside the warmup
        first = len(seen)
        metrics = train_run(resumed_opts, log=lambda *_: None)
    finally:
        handle.remove()
    assert first == 3 and [lr for lr, *_ in seen[first:]] == pytest.approx([8e-4, 1e-3, 1e-3])  # steps 4-6
    assert without_seconds(metrics) == without_seconds(reference)
