"""``zoo generate``: determinism across worker counts, resume after a kill, settings checks."""

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from generate_helpers import kill_after_chunks
from zoo.generate.plan import limited_counts
from zoo.generate.run import GenerateOptions, generate
from zoo.store import StoreError, WeightStore

SMALL = dict(kind="mnist-inr", dataset="digits", limit=48, chunk_size=8, steps=25, lr=1e-3, progress=False)


def _arrays(root):
    store = WeightStore(root)
    return store.read(0, store.num_networks), store.networks.drop_columns([]).to_pydict()


def assert_same_store(a, b):
    (pa, ta), (pb, tb) = _arrays(a), _arrays(b)
    for name in pa:
        np.testing.assert_array_equal(pa[name], pb[name])
    assert ta["index"] == tb["index"] and ta["split"] == tb["split"]
    np.testing.assert_array_equal(ta["psnr"], tb["psnr"])
    stats_b = WeightStore(b).stats()
    for name, (mean, std) in WeightStore(a).stats().items():  # bit for bit: reduced in chunk order (issue 21)
        np.testing.assert_array_equal(mean, stats_b[name][0])
        np.testing.assert_array_equal(std, stats_b[name][1])


@pytest.fixture(scope="module")
def reference_store(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "store"
    generate(GenerateOptions(out=str(out), **SMALL), log=lambda *_: None)
    return out


def test_ray_workers_give_the_same_store_as_one_process(reference_store, tmp_path, monkeypatch):
    """Embedded Ray starts a cluster of its own, also where the environment names another (RAY_ADDRESS,
    as a `ray start` on the same machine would): before, Ray connected to it and refused num_cpus."""
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")  # nothing listens there
    out = tmp_path / "ray"
    generate(GenerateOptions(out=str(out), workers=2, use_ray=True, **SMALL), log=lambda *_: None)
    assert_same_store(reference_store, out)


def test_rerun_after_kill_resumes_without_gaps(reference_store, tmp_path):
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "cli", "generate", "mnist-inr", "--out", str(out), "--dataset", "digits",
           "--limit", "48", "--chunk-size", "8", "--steps", "25", "--lr", "1e-3"]
    state = kill_after_chunks(cmd, out, chunks=2)
    assert state["status"] == "in_progress" and len(state["complete_chunks"]) == 2
    with pytest.raises(StoreError, match="incomplete"):
        WeightStore(out)
    logs = []
    generate(GenerateOptions(out=str(out), **SMALL), log=logs.append)
    assert any("resuming" in line for line in logs)
    assert_same_store(reference_store, out)


def test_rerun_of_complete_store_changes_nothing(reference_store):
    before = (reference_store / "manifest.json").read_text()
    logs = []
    generate(GenerateOptions(out=str(reference_store), **SMALL), log=logs.append)
    assert "already complete" in logs[0]
    assert (reference_store / "manifest.json").read_text() == before


def test_rerun_with_other_settings_is_refused(reference_store):
    """The refusal names only the settings that differ, with both values."""
    with pytest.raises(StoreError, match="different settings") as err:
        generate(GenerateOptions(out=str(reference_store), **{**SMALL, "seed": 1}), log=lambda *_: None)
    differences = str(err.value).splitlines()[1:-1]
    assert differences == ["  generation.seed: store 0, asked 1"]


def test_resume_of_a_store_with_other_init_ranges_is_refused(tmp_path):
    """A store written before the init ranges were recorded (its "reference" started the first layer
    wide) must not be resumed with today's "reference": its networks would mix two recipes."""
    out = tmp_path / "old"
    opts = GenerateOptions(out=str(out), **{**SMALL, "limit": 16, "init": "reference"})
    generate(opts, log=lambda *_: None)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["architecture"]["init_ranges"][0]["weight"] == pytest.approx(3 ** 0.5 / 30)
    del manifest["architecture"]["init_ranges"], manifest["checksum"]  # such stores had no checksum either
    del manifest["content_id"]  # nor a content ID
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match="different settings"):
        generate(opts, log=lambda *_: None)


def test_siren_store_from_before_the_init_ranges_still_resumes(reference_store, tmp_path):
    """siren's ranges did not change when they started to be recorded: such an old store is accepted."""
    import shutil

    out = tmp_path / "old-siren"
    shutil.copytree(reference_store, out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["architecture"]["init"] == "siren"
    del manifest["architecture"]["init_ranges"], manifest["checksum"]  # such stores had no checksum either
    del manifest["content_id"]  # nor a content ID
    (out / "manifest.json").write_text(json.dumps(manifest))
    logs = []
    generate(GenerateOptions(out=str(out), **SMALL), log=logs.append)
    assert "already complete" in logs[0]


def test_limit_keeps_split_proportions():
    counts = limited_counts({"train": 55000, "val": 5000, "test": 10000}, 700)
    assert counts == {"train": 550, "val": 50, "test": 100}
    assert sum(limited_counts({"train": 10, "val": 1, "test": 3}, 5).values()) == 5


def test_views_and_sine_targets(tmp_path):
    out = tmp_path / "sines"
    generate(GenerateOptions(kind="sine-ssl", out=str(out), limit=10, views=2, chunk_size=8, steps=20,
                             progress=False), log=lambda *_: None)
    store = WeightStore(out)
    t = store.networks.to_pydict()
    assert store.num_networks == 20 and store.widths == (1, 32, 32, 1)
    assert t["view"][:4] == [0, 1, 0, 1] and t["source_item"][0] == t["source_item"][1]
    assert t["amplitude"][0] == t["amplitude"][1] and 0 <= t["frequency"][0] <= 10
    w = store.read(0, 2)["W2"]
    assert not np.array_equal(w[0], w[1])  # the two views start from different initializations


def test_unknown_kind_and_missing_data_are_clear(tmp_path):
    with pytest.raises(KeyError, match="unknown zoo kind"):
        generate(GenerateOptions(kind="imagenet-inr", out=str(tmp_path / "x")))
    from zoo.sources import DataError

    with pytest.raises(DataError):
        generate(GenerateOptions(kind="mnist-inr", out=str(tmp_path / "y"), data_root=str(tmp_path)))
    assert not (tmp_path / "y").exists()  # nothing half-made


def test_progress_bar_moves_within_a_chunk_in_process(tmp_path, monkeypatch):
    """In-process chunks report every fitting step, so a one-chunk zoo does not sit at 0% until it
    is written; the bar ends at the number of networks."""
    from zoo.generate import progress

    seen = []
    original = progress.GenerateProgress.reporter

    def recording(self, chunk, networks):
        report = original(self, chunk, networks)
        return lambda fraction: (report(fraction), seen.append(self.bar.n))

    monkeypatch.setattr(progress.GenerateProgress, "reporter", recording)
    generate(GenerateOptions(out=str(tmp_path / "s"), **{**SMALL, "limit": 16, "chunk_size": 16, "progress": True}),
             log=lambda *_: None)
    assert len(set(seen)) > 5 and max(seen) <= 15 and seen == sorted(seen)


def test_progress_accounting_and_the_ticker_while_workers_say_nothing():
    from zoo.generate.progress import GenerateProgress

    bar = GenerateProgress(total=30, done=10, desc="t", enabled=True, chunks_left=2)
    report = bar.reporter(chunk=1, networks=10)
    for fraction in (0.25, 0.2, 0.55, 1.0):
        report(fraction)
    assert bar.bar.n == 10 + 9  # never backwards, never the whole chunk before it is written
    bar.chunk_written(1, 10, {"psnr": "30dB"})
    bar.chunk_written(2, 10, {})
    assert bar.bar.n == 30
    bar.close()
    ticking = GenerateProgress(total=4, done=0, desc="t", enabled=True, chunks_left=3, workers=2, tick_seconds=0.01)
    try:
        deadline = time.time() + 5
        while "running" not in (ticking.bar.postfix or "") and time.time() < deadline:
            time.sleep(0.01)
        assert "running=2 chunk(s)" in ticking.bar.postfix
    finally:
        ticking.close()


def test_the_ticker_redraws_no_more_often_than_the_bars_mininterval():
    """``TQDM_MININTERVAL`` (the queue's 30 s) also spaces the ticker's forced redraws, which would
    otherwise write a line a second into a log file for as long as Ray workers run. tqdm reads the
    variable when it is imported, so a fresh interpreter; the ticker thread records the interval it
    was started with instead of sleeping, so nothing here depends on timing."""
    script = textwrap.dedent("""
        from zoo.generate.progress import GenerateProgress
        waits = []
        GenerateProgress._tick = lambda self, seconds: waits.append(seconds)
        bar = GenerateProgress(total=4, done=0, desc="t", enabled=True, chunks_left=3, workers=2, tick_seconds=0.01)
        bar.close()
        print(bar.tick_seconds, *waits)
    """)
    def run(env):
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        return [float(word) for word in out.stdout.split()]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_")}
    assert run({**env, "TQDM_MININTERVAL": "0.5"}) == [0.5, 0.5]
    assert run(env) == [0.1, 0.1]  # tqdm's own 0.1 s: the ticker's 0.01 s is raised to it, not to 0.5
    from zoo.generate.progress import GenerateProgress

    quiet = GenerateProgress(total=4, done=0, desc="t", enabled=False, workers=2)  # the pipelines' progress=False
    assert quiet.tick_seconds == 1.0
    quiet.close()
