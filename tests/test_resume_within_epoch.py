"""An epoch longer than ``--checkpoint-minutes`` is saved within it too: a rerun skips the batches the
epoch trained on and ends with the uninterrupted run's result, bit for bit, in memory and streamed
(with loader processes, whose start draws from the global generator)."""

import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cli import main
from dws.tasks.checkpoint import Checkpoint
from dws.tasks.options import TrainOptions
from dws.tasks.prepare import prepare_run
from dws.tasks.run import train_run

from test_resume import COMMON, Interrupted, assert_same_metrics, best_state, interrupt_after, without_seconds

EVERY_STEP = 1e-9  # --checkpoint-minutes: a save after every step


def quiet(*_):
    pass


def streamed(opts: TrainOptions) -> TrainOptions:
    """``opts`` with a --max-memory one byte short of holding the train split whole: it streams."""
    plan = prepare_run(opts, log=quiet).memory
    return replace(opts, max_memory=sum(plan.fixed.values()) + plan.splits["train"].held - 1)


@pytest.fixture(scope="module")
def small_chunks(tmp_path_factory):
    """The tiny store's networks in chunks of 8: its train split is more than a window of 3 chunks."""
    from zoo.generate.run import GenerateOptions, generate

    from generate_helpers import TINY

    out = tmp_path_factory.mktemp("stores") / "digits-chunks8"
    generate(GenerateOptions(out=str(out), **{**TINY, "chunk_size": 8}), log=quiet)
    return out


@pytest.fixture(scope="module", params=["memory", "stream"])
def reference(request, tiny_store, small_chunks, tmp_path_factory):
    """One seed of test_resume's settings, uninterrupted and saved only after every epoch."""
    out = tmp_path_factory.mktemp(f"within-{request.param}")
    opts = TrainOptions(store=str(tiny_store), out=str(out / "reference"), **{**COMMON, "seeds": 1})
    if request.param == "stream":  # one loader process, whose start draws from the global generator
        opts = replace(opts, store=str(small_chunks), loader_workers=1)
        opts = streamed(opts)
        assert not prepare_run(opts, log=quiet).loaders(0)["train"].in_memory
    return opts, train_run(replace(opts, checkpoint_minutes=0), log=quiet)


def saves_of(opts: TrainOptions, monkeypatch) -> list[dict]:
    """The values of every checkpoint ``opts``' training writes, in order."""
    real, values = Checkpoint.save, []

    def save(self, objects, saved):
        real(self, objects, saved)
        values.append({**saved, "loader": objects["loader:train"].state_dict()})

    monkeypatch.setattr(Checkpoint, "save", save)
    train_run(opts, log=quiet)
    monkeypatch.undo()
    return values


def test_saves_come_within_epochs_with_the_epochs_start_position(reference, tmp_path, monkeypatch):
    opts, _ = reference
    batches = prepare_run(opts, log=quiet).loaders(0)["train"].__len__()
    assert batches >= 3, "the test needs epochs of several batches"
    every_step = saves_of(replace(opts, out=str(tmp_path / "a"), checkpoint_minutes=EVERY_STEP), monkeypatch)
    assert len(every_step) == opts.epochs * (batches + 1)  # after each step, and after each epoch
    for epoch in range(opts.epochs):
        for k in range(1, batches + 1):
            values = every_step[epoch * (batches + 1) + k - 1]
            assert values["within"]["batches"] == k and values["within"]["of"] == batches
            assert len(values["within"]["losses"]) == k and values["epoch"] == epoch
            assert values["loader"]["epoch"] == epoch  # where the epoch began, not where its iteration is
        assert "within" not in every_step[(epoch + 1) * (batches + 1) - 1]
    epochs_only = saves_of(replace(opts, out=str(tmp_path / "b"), checkpoint_minutes=0), monkeypatch)
    assert [v["epoch"] for v in epochs_only] == list(range(1, opts.epochs + 1))
    assert all("within" not in v for v in epochs_only)


@pytest.mark.parametrize("batch", [1, 2, "last"])
def test_a_run_interrupted_within_an_epoch_resumes_to_the_uninterrupted_result(reference, tmp_path, monkeypatch,
                                                                                batch):
    opts, expected = reference
    batches = len(prepare_run(opts, log=quiet).loaders(0)["train"])
    batch = batches if batch == "last" else batch
    opts = replace(opts, out=str(tmp_path / "run"), checkpoint_minutes=EVERY_STEP)
    interrupt_after(monkeypatch, (batches + 1) + batch)  # in epoch 2, after its batch-th step
    with pytest.raises(Interrupted):
        train_run(opts, log=quiet)
    monkeypatch.undo()
    torch.manual_seed(1234), np.random.seed(5), random.seed(6)  # whatever the generators hold now is replaced

    lines = []
    metrics = train_run(opts, log=lines.append)
    assert f"resuming lr 0.001, seed 0 in epoch 2 of 3, after {batch} of its {batches} batches" in lines, lines
    assert without_seconds(metrics) == without_seconds(expected)
    for key, value in best_state(Path(expected["run_dir"])).items():
        assert torch.equal(value, best_state(tmp_path / "run")[key]), key


def test_the_global_generator_is_restored_after_the_skipped_batches(reference, tmp_path, monkeypatch):
    """Control: a resume that keeps the generator as the skipped batches left it ends elsewhere where
    reading draws from it (loader processes); in memory nothing draws, and it makes no difference."""
    import dws.tasks.trainer as trainer

    opts, expected = reference
    streaming = opts.loader_workers > 0
    batches = len(prepare_run(opts, log=quiet).loaders(0)["train"])
    opts = replace(opts, out=str(tmp_path / "run"), checkpoint_minutes=EVERY_STEP)
    interrupt_after(monkeypatch, (batches + 1) + 1)
    with pytest.raises(Interrupted):
        train_run(opts, log=quiet)
    monkeypatch.undo()
    restored = []
    monkeypatch.setattr(trainer, "set_global_random_state", restored.append)  # the restore left out
    metrics = train_run(opts, log=quiet)
    assert len(restored) == 1
    assert (without_seconds(metrics) != without_seconds(expected)) == streaming


def test_checkpoint_minutes_is_a_speed_setting_and_refuses_negative_values(tiny_store, tmp_path, monkeypatch):
    args = ["train", str(tiny_store), "--out", str(tmp_path / "run"), "--epochs", "2", "--lr", "1e-3",
            "--batch-size", "16", "--hidden-channels", "8", "--precise-bn", "16"]
    refused = CliRunner().invoke(main, [*args, "--checkpoint-minutes", "-1"])
    assert refused.exit_code == 2 and "--checkpoint-minutes" in refused.output
    interrupt_after(monkeypatch, 2)  # within the first epoch
    with pytest.raises(Interrupted):
        train_run(TrainOptions(store=str(tiny_store), out=str(tmp_path / "run"), epochs=2, lr=1e-3, batch_size=16,
                               hidden_channels=8, precise_bn=16, progress=False, checkpoint_minutes=EVERY_STEP),
                  log=quiet)
    monkeypatch.undo()
    resumed = CliRunner().invoke(main, [*args, "--checkpoint-minutes", "0"])  # another value resumes the run
    assert resumed.exit_code == 0, resumed.output
    assert "resuming lr 0.001, seed 0 in epoch 1 of 2, after 2 of its" in resumed.output


@pytest.mark.parametrize("reference", ["memory"], indirect=True)  # one kill is enough
def test_a_process_killed_within_an_epoch_resumes_to_the_same_metrics(reference, tmp_path):
    """SIGKILL after a save within an epoch (no chance to clean up), then the same command again."""
    import os
    import signal
    import subprocess
    import sys
    import time

    opts, expected = reference
    out = tmp_path / "run"
    command = [sys.executable, "-m", "cli", "train", opts.store, "--out", str(out), "--epochs", "3", "--lr", "1e-3",
               "--batch-size", "16", "--hidden-channels", "8", "--dropout", "0.1", "--precise-bn", "16",
               "--checkpoint-minutes", "1e-9"]
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the tests' thread count: the same float rounding
    victim = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    saved, path = None, out / "checkpoints" / "lr0.001-seed0.pt"
    while saved is None:
        assert victim.poll() is None, "the run ended before it could be killed"
        if path.exists():  # (replaced atomically: always a whole file)
            values = torch.load(path, weights_only=False)["values"]
            if values.get("within") and values["epoch"] >= 1:
                victim.send_signal(signal.SIGKILL)
                saved = values
        time.sleep(0.002)
    victim.wait()
    saved = torch.load(path, weights_only=False)["values"]  # the last save before the kill
    again = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    if saved.get("within"):
        assert (f"resuming lr 0.001, seed 0 in epoch {saved['epoch'] + 1} of 3, after {saved['within']['batches']} "
                f"of its {saved['within']['of']} batches") in again.stdout
    assert_same_metrics(out, expected)


class _Flat(torch.nn.Module):
    """A linear classifier of a network's flattened parameters, with dropout (each worker's own draws)."""

    def __init__(self, widths):
        super().__init__()
        features = sum(o * i + o for i, o in zip(widths, widths[1:]))
        self.drop, self.linear = torch.nn.Dropout(0.2), torch.nn.Linear(features, 10)

    def forward(self, ws):
        return self.linear(self.drop(torch.cat([t.flatten(1) for t in (*ws.weights, *ws.biases)], 1)))


def _data_parallel_worker(rank: int, world: int, port: int, store: str, folder: str, results) -> None:
    """Worker ``rank`` of ``world`` (gloo): the same 2-epoch training uninterrupted, then interrupted after
    the save of epoch 2's 3rd step and resumed in the same process; both outcomes to ``results``. Only
    rank 0 finds a save due after every step (the others' clocks would not ask for one for days): all
    save, since a save is a collective call that every worker must make after the same step."""
    import datetime
    import os

    import torch.distributed as dist

    from dws.stream import WeightStoreLoader
    from dws.tasks.objectives import get_task
    from dws.tasks.trainer import TrainConfig, train

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)

    batches = len(WeightStoreLoader(store, "train", batch_size=8))

    class InterruptedAfter(Checkpoint):
        saves = 0

        def save(self, objects, values):
            super().save(objects, values)
            InterruptedAfter.saves += 1
            if InterruptedAfter.saves == batches + 1 + 3:  # each step and epoch 1's end, then 3 steps
                raise Interrupted

    def run(checkpoint: Checkpoint, minutes: float, lines: list):
        torch.manual_seed(0)
        loaders = {split: WeightStoreLoader(store, split, batch_size=8, shuffle=split == "train")
                   for split in ("train", "val", "test")}
        model = torch.nn.parallel.DistributedDataParallel(_Flat(loaders["train"].widths))
        result = train(model, get_task("classify"), loaders, TrainConfig(epochs=2, progress=False,
                                                                         checkpoint_minutes=minutes),
                       shard=(rank, world), checkpoint=checkpoint, log=lines.append)
        return result.history, {k: v.clone() for k, v in result.state_dict.items()}

    minutes = EVERY_STEP if rank == 0 else 1e6
    try:
        lines = []
        expected = run(Checkpoint(Path(folder) / "a.pt", "a", rank, world), 0, lines)
        try:
            run(InterruptedAfter(Path(folder) / "b.pt", "b", rank, world), minutes, lines)
            results.put((rank, "not interrupted", None))
            return
        except Interrupted:
            pass
        dist.barrier()  # rank 0 has written the file (the others return from the save before it does)
        saved = torch.load(Path(folder) / "b.pt", weights_only=False)["values"]["within"]
        resumed = run(Checkpoint(Path(folder) / "b.pt", "b", rank, world), minutes, lines)
        same_state = all(torch.equal(expected[1][k], resumed[1][k]) for k in expected[1])
        results.put((rank, "resumed", (expected[0] == resumed[0], same_state, lines, saved, batches)))
    finally:
        dist.destroy_process_group()


def test_data_parallel_workers_save_within_an_epoch_after_the_same_step_and_resume_exactly(tiny_store, tmp_path):
    """Every worker decides to save after the same step (one collective with the NaN check), each worker's
    epoch losses and generators are kept, and the resumed training ends as the uninterrupted one did."""
    import multiprocessing
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    workers = [ctx.Process(target=_data_parallel_worker, args=(rank, 2, port, str(tiny_store), str(tmp_path), results))
               for rank in range(2)]
    for w in workers:
        w.start()
    outcome = dict((rank, (kind, found)) for rank, kind, found in (results.get(timeout=240) for _ in workers))
    for w in workers:
        w.join(timeout=30)
    for rank in range(2):
        kind, (same_history, same_state, lines, saved, batches) = outcome[rank]
        assert kind == "resumed"
        assert saved["batches"] == 3 and saved["of"] == batches >= 4
        assert [len(losses) for losses in saved["losses"]] == [3, 3]  # both workers' losses
        assert f"resuming b in epoch 2 of 2, after 3 of its {batches} batches" in lines, lines
        assert same_history and same_state, rank


def test_a_loaders_position_records_how_it_reads_the_split_which_decides_the_order(small_chunks):
    """A shuffled epoch's order depends on how the split is read (held whole, or the shuffle windows' size,
    which --max-memory and --loader-workers decide), so a shuffled loader's position says how it read it."""
    from dws.stream import WeightStoreLoader

    def loader(**how):
        return WeightStoreLoader(small_chunks, "train", batch_size=8, seed=3, **how)

    held, windows, wider = loader(in_memory=True), loader(in_memory=False, buffer_chunks=2), \
        loader(in_memory=False, buffer_chunks=5)
    orders = [[batch.index.tolist() for batch in each] for each in (held, windows, wider)]
    assert orders[0] != orders[1] != orders[2] != orders[0]  # three orders of one epoch
    assert [each.state_dict()["reading"] for each in (held, windows, wider)] == \
        ["in memory", "in shuffle windows of 2 chunk(s)", "in shuffle windows of 5 chunk(s)"]
    again = loader(in_memory=False, buffer_chunks=2)
    again.load_state_dict({"epoch": 0, "seed": 3})  # a position saved before the reading was recorded
    assert [batch.index.tolist() for batch in again] == orders[1]
    assert again.state_dict() == {"epoch": 1, "seed": 3, "reading": "in shuffle windows of 2 chunk(s)"}
    assert "reading" not in WeightStoreLoader(small_chunks, "val", batch_size=8, shuffle=False).state_dict()


@pytest.mark.parametrize("reference", ["stream"], indirect=True)
def test_a_resume_that_reads_the_split_otherwise_redoes_the_epoch_from_its_start(reference, tmp_path, monkeypatch):
    """Another --loader-workers changed the memory plan (the shuffle windows): the batches the epoch
    trained on are not the first ones of the new order, so the epoch starts over (said in a line)
    instead of skipping other batches (the same options resume within it: the tests above)."""
    opts, _ = reference
    opts = replace(opts, out=str(tmp_path / "run"), checkpoint_minutes=EVERY_STEP)
    assert prepare_run(opts, log=quiet).loaders(0)["train"].reading != \
        prepare_run(replace(opts, loader_workers=0), log=quiet).loaders(0)["train"].reading
    interrupt_after(monkeypatch, 2)
    with pytest.raises(Interrupted):
        train_run(opts, log=quiet)
    monkeypatch.undo()
    lines = []
    train_run(replace(opts, loader_workers=0), log=lines.append)
    assert any("lr 0.001, seed 0: the train split is read in shuffle windows of" in line and
               "when epoch 1 was saved after 2 batches" in line and "that epoch restarts from its first batch" in line
               for line in lines), lines
    assert "resuming lr 0.001, seed 0 after epoch 0 of 3" in lines


def test_a_training_loader_without_a_position_is_saved_after_epochs_only(tiny_store, tmp_path):
    """Its batches on a rerun need not be the ones it trained on, so nothing is saved within an epoch."""
    from dws.stream import WeightStoreLoader
    from dws.tasks.objectives import get_task
    from dws.tasks.trainer import TrainConfig, train

    saved = []

    class Counted(Checkpoint):
        def save(self, objects, values):
            super().save(objects, values)
            saved.append("within" in values)

    store = WeightStoreLoader(tiny_store, "train", batch_size=8)
    batches = list(store)  # a plain list: no state_dict
    loaders = {"train": batches, "val": WeightStoreLoader(tiny_store, "val", batch_size=8, shuffle=False),
               "test": WeightStoreLoader(tiny_store, "test", batch_size=8, shuffle=False)}
    train(_Flat(store.widths), get_task("classify"), loaders,
          TrainConfig(epochs=2, progress=False, checkpoint_minutes=EVERY_STEP),
          checkpoint=Counted(tmp_path / "c.pt", "c"))
    assert saved == [False, False]


def test_saves_within_an_epoch_come_every_checkpoint_minutes_counted_from_the_last_save(tiny_store, tmp_path,
                                                                                     monkeypatch):
    """A clock that moves one minute per training step: with --checkpoint-minutes 4.5 the saves within
    epochs come after 5 steps, counted again from each epoch's own save (6 batches of 8 an epoch)."""
    import types

    import dws.tasks.trainer as trainer
    from dws.stream import WeightStoreLoader
    from dws.tasks.objectives import get_task

    clock = [0.0]
    monkeypatch.setattr(trainer, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    task = get_task("classify")

    class Ticking:  # the task, with a minute passing in every step
        def __getattr__(self, name):
            return getattr(task, name)

        def loss(self, *args):
            clock[0] += 60.0
            return task.loss(*args)

    saved = []

    class Counted(Checkpoint):
        def save(self, objects, values):
            super().save(objects, values)
            saved.append((values["epoch"], values["within"]["batches"] if "within" in values else "end"))

    loaders = {split: WeightStoreLoader(tiny_store, split, batch_size=8, shuffle=split == "train")
               for split in ("train", "val", "test")}
    assert len(loaders["train"]) == 6
    trainer.train(_Flat(loaders["train"].widths), Ticking(), loaders,
                  trainer.TrainConfig(epochs=3, progress=False, checkpoint_minutes=4.5),
                  checkpoint=Counted(tmp_path / "c.pt", "c"))
    assert saved == [(0, 5), (1, "end"), (1, 5), (2, "end"), (2, 5), (3, "end")]
