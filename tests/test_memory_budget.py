"""--max-memory: sizes, the budget's split (dws.stream.memory), streaming forced by a small budget
giving the in-memory results bit for bit, windows let go of, and the one-line refusals."""

from __future__ import annotations

import gc
import json
import weakref
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner

from cli import main
from dws.stream import WeightStoreLoader
from dws.stream.batch import Batch, rebatch
from dws.stream.memory import model_bytes, network_bytes, plan_memory
from dws.stream.synthetic import write_synthetic_store
from dws.tasks.options import TrainOptions
from dws.tasks.prepare import prepare_run
from dws.tasks.rundir import evaluate_run, load_run
from dws.tasks.run import train_run
from dws.weightspace import WeightSpace
from zoo.options import format_size, parse_size
from zoo.store import WeightStore

MiB = 2**20


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """230 random (2, 8, 8, 1) networks in chunks of 16: splits 184/23/23, not chunk-aligned."""
    root = tmp_path_factory.mktemp("budget") / "synth"
    return WeightStore(write_synthetic_store(root, widths=(2, 8, 8, 1), num_networks=230, chunk_size=16, seed=5))


@pytest.mark.parametrize("text, size", [("8G", 8 * 2**30), ("512M", 512 * MiB), ("512m", 512 * MiB),
                                        ("1.5GiB", 3 * 2**29), ("64K", 2**16), ("4096", 4096), ("2 GB", 2 * 2**30),
                                        ("1T", 2**40), (".5G", 2**29)])
def test_sizes_parse_in_binary_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "8Q", "-1G", "0", "0.1", "eight", "8G8"])
def test_a_bad_size_is_refused_naming_the_flag(text):
    with pytest.raises(ValueError, match="--max-memory"):
        parse_size(text)


def test_sizes_are_shown_for_people():
    assert [format_size(s) for s in (512, 3 * 2**10, 420 * MiB, 4 * 2**30)] == ["512 B", "3.0 KiB", "420 MiB",
                                                                                "4.0 GiB"]


def plan(store, budget, **kw):
    counts = {name: len(range(*store.split_range(name))) for name in ("train", "val", "test")}
    return plan_memory(budget, store, counts, **{"shuffled": "train", "batch_size": 8, "model_bytes": 1000,
                                                  "training": True, **kw})


def test_the_budget_holds_train_first_then_val_then_test(synth):
    net, chunk = network_bytes(synth), 16 * network_bytes(synth)
    fixed = sum(plan(synth, 2**40).fixed.values())
    train, val = 184 * net, 23 * net
    everything = plan(synth, fixed + 230 * net)
    assert all(s.in_memory for s in everything.splits.values()) and everything.peak == fixed + 230 * net
    held = plan(synth, fixed + train + val)  # test does not fit beside them: streamed chunk by chunk
    assert [held.splits[s].in_memory for s in ("train", "val", "test")] == [True, True, False]
    assert held.splits["test"].held == 0 and held.peak <= fixed + train + val
    windows = plan(synth, fixed + 5 * chunk + 3)  # train streams in windows of 5 whole chunks; nothing left for val
    assert not windows.splits["train"].in_memory and windows.splits["train"].buffer_chunks == 5
    assert not windows.splits["val"].in_memory and not windows.splits["test"].in_memory
    assert windows.peak <= windows.budget
    # a worker builds one window and queues one beside the one cut into batches: windows of a third
    workers = plan(synth, fixed + chunk + 9 * chunk, workers=1)
    assert workers.splits["train"].buffer_chunks == 3


def test_a_budget_below_one_chunk_and_one_batch_is_refused_with_the_minimum(synth):
    fixed = sum(plan(synth, 2**40).fixed.values())
    least = fixed + 16 * network_bytes(synth)  # a window of one chunk
    assert plan(synth, least).splits["train"].buffer_chunks == 1
    with pytest.raises(ValueError, match=f"needs at least {format_size(least)}") as refused:
        plan(synth, least - 1)
    assert "\n" not in str(refused.value) and "a batch" not in str(refused.value)
    assert "batches of 8" in str(refused.value) and "windows of one chunk" in str(refused.value)
    # evaluating streams chunk by chunk: no window, so the fixed parts are the least
    evaluating = dict(shuffled=None, training=False)
    assert not any(s.in_memory for s in plan(synth, sum(plan(synth, 2**40, **evaluating).fixed.values()),
                                               **evaluating).splits.values())


def test_a_split_read_into_memory_chunk_by_chunk_equals_the_store(synth):
    loader = WeightStoreLoader(synth, "val", normalize=False, shuffle=False, in_memory=True, limit=20)
    start, stop = synth.split_range("val")
    data = loader._data  # 20 networks spread over the split (limit), in store order
    assert len(data.index) == 20 and bool((data.index.diff() > 0).all())
    arrays = {name: values[(data.index - start).numpy()] for name, values in synth.read(start, stop).items()}
    for name, values in zip(synth.parameter_names, [t for pair in zip(data.ws.weights, data.ws.biases) for t in pair]):
        assert torch.equal(values, torch.from_numpy(arrays[name]).reshape(values.shape)), name


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_tiny_budget_streams_the_same_networks_once(synth, shuffle):
    memory = list(WeightStoreLoader(synth, batch_size=10, seed=2, shuffle=shuffle, in_memory=True))
    streamed_loader = WeightStoreLoader(synth, batch_size=10, seed=2, shuffle=shuffle, ram_budget=3 * 16 * 4 * 100)
    assert not streamed_loader.in_memory and streamed_loader.buffer_chunks == (2 if shuffle else 1)
    streamed = list(streamed_loader)
    index = [torch.cat([b.index for b in batches]) for batches in (memory, streamed)]
    assert sorted(index[1].tolist()) == sorted(index[0].tolist()) == list(range(184))
    if not shuffle:  # the same order: the same batches, bit for bit
        for a, b in zip(memory, streamed):
            assert all(torch.equal(x, y) for x, y in zip(a.ws.weights + a.ws.biases, b.ws.weights + b.ws.biases))


def test_a_spent_window_is_let_go_before_the_next_is_read():
    """rebatch copies the last batch of a block and the rest left over, so the consumer holding its
    batch does not keep the whole block alive while the next one is made."""
    alive = []

    def block(k):
        weights = torch.randn(25, 3, 2)
        alive.append(weakref.ref(weights))
        return Batch(WeightSpace((weights,), (torch.randn(25, 3),)), torch.zeros(25), torch.arange(25 * k, 25 * k + 25))

    def blocks():
        for k in range(4):
            gc.collect()
            assert all(ref() is None for ref in alive), f"block {k - 1} still held while block {k} is read"
            yield block(k)

    seen = []
    for batch in rebatch(blocks(), 10, drop_last=False):  # the loop keeps its last batch while asking for more
        seen.append(batch.index)
    assert torch.equal(torch.cat(seen), torch.arange(100)) and [len(i) for i in seen] == [10] * 10


def options(store, out, **kw) -> TrainOptions:
    return TrainOptions(store=str(store.root), model="stats", epochs=2, lr=1e-3, batch_size=16, precise_bn=32,
                        progress=False, out=str(out), **kw)


def test_streaming_val_and_test_trains_and_evaluates_bit_for_bit_as_in_memory(synth, tmp_path):
    roomy = options(synth, tmp_path / "roomy")
    run = prepare_run(roomy, log=lambda *_: None)
    assert all(split.in_memory for split in run.memory.splits.values())
    # just room for the train split: validation and test stream chunk by chunk, training's order is unchanged
    tight = replace(roomy, out=str(tmp_path / "tight"),
                    max_memory=sum(run.memory.fixed.values()) + run.memory.splits["train"].held)
    lines = []
    results = [train_run(roomy, log=lambda *_: None), train_run(tight, log=lines.append)]
    assert any("val streamed chunk by chunk" in line and "test streamed chunk by chunk" in line for line in lines)
    assert results[0]["history"] == results[1]["history"] and results[0]["test"] == results[1]["test"]
    # zoo eval with the test split streamed gives the same metrics as held in memory
    loaded = load_run(tmp_path / "roomy")
    evaluating = plan_memory(2**40, synth, {"test": 23}, shuffled=None, batch_size=512,
                             model_bytes=model_bytes(loaded.model), training=False)
    assert evaluating.splits["test"].in_memory
    too_small_for_test = sum(evaluating.fixed.values()) + evaluating.splits["test"].held - 1
    in_memory = evaluate_run(tmp_path / "roomy", synth.root, "test")
    streamed = evaluate_run(tmp_path / "roomy", synth.root, "test", max_memory=too_small_for_test)
    assert in_memory == streamed and in_memory["networks"] == 23


def test_the_commands_refuse_a_budget_in_one_line(synth, tmp_path):
    runner = CliRunner()
    for argv in (["train", str(synth.root), "--model", "stats", "--out", str(tmp_path / "run"), "--max-memory", "1M"],
                 ["verify", str(synth.root), "--max-memory", "100M"],
                 ["info", str(synth.root), "--max-memory", "64M"],
                 ["train", str(synth.root), "--max-memory", "lots"]):
        result = runner.invoke(main, argv)
        assert result.exit_code == 2, (argv, result.output)
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith("error: --max-memory"), result.output
        assert result.output.endswith(errors[0] + "\n")  # the last line, nothing after it
    assert not (tmp_path / "run").exists()
    assert "needs at least" in runner.invoke(main, ["verify", str(synth.root), "--max-memory", "100M"]).output
    assert "without a unit" not in runner.invoke(main, ["verify", str(synth.root), "--max-memory", "100M"]).output
    # a unit left out: 8 bytes, said so with the size it probably meant
    bare = runner.invoke(main, ["verify", str(synth.root), "--max-memory", "8"]).output
    assert "--max-memory 8 B is too small" in bare and "a size without a unit counts bytes: write e.g. 8G" in bare
    ok = runner.invoke(main, ["verify", str(synth.root), "--max-memory", "1G"])
    assert ok.exit_code == 0, ok.output
    # (info cannot summarize a synthetic store, which has no PSNR column; it gets past the budget)
    assert "--max-memory" not in runner.invoke(main, ["info", str(synth.root), "--max-memory", "1G"]).output


def test_the_budget_is_a_setting_of_a_run(synth, tmp_path):
    """It decides the data order, so a resumed run must not change it silently."""
    from dws.tasks.prepare import resume_settings

    opts = options(synth, tmp_path)
    settings = resume_settings(opts, synth)
    assert settings["--max-memory"] == 4 * 2**30
    assert resume_settings(replace(opts, max_memory=2**30), synth)["--max-memory"] != settings["--max-memory"]
    assert json.loads(json.dumps(settings)) == settings
