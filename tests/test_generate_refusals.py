"""``zoo generate`` refuses what cannot make a store before anything is written (exit 2, no folder),
and ``--limit`` keeps what it says (docs: README "Generating a zoo")."""

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from cli import main
from clf_helpers import write_cifar_like, write_mnist_like
from zoo.generate.kinds import KINDS
from zoo.generate.plan import limited_counts
from zoo.generate.run import GenerateOptions, generate
from zoo.store.manifest import write_manifest
from zoo.sources import SOURCES
from zoo.store import WeightStore
from zoo.store.writer import create_store

QUIET = dict(log=lambda *_: None)
PAPER_MNIST = KINDS["mnist-inr"].splits


def assert_refused(args, message, out):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output
    assert "Traceback" not in result.output
    assert not out.exists(), f"{out} was created"
    return result.output


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Files for every data source that reads files: MNIST-format (also the offline sources' test
    files: 8,010 of them, so that mnist-offline-xl has test images) and CIFAR-10 batches."""
    root = tmp_path_factory.mktemp("data")
    idx = write_mnist_like(root / "idx", n_train=5_010, n_test=8_010)
    cifar = write_cifar_like(root / "cifar", per_batch=10, n_test=20)
    unverified = {"verify": False}
    return {"mnist": (idx, unverified), "fashion-mnist": (idx, unverified), "mnist-offline": (idx, unverified),
            "mnist-offline-xl": (idx, unverified), "cifar10": (cifar, unverified), "cifar10-unverified": (cifar, {})}


def small(kind: str) -> dict:
    """A few networks of ``kind``, one or two steps each."""
    if kind.endswith("classifiers"):
        return dict(limit={"train": 2, "val": 1, "test": 1}, steps=2, batch_size=8, chunk_size=64)
    return dict(limit={"train": 2, "val": 1, "test": 1}, steps=1, chunk_size=4)


@pytest.mark.parametrize("dataset", sorted(SOURCES))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_makes_its_datasets_and_refuses_the_others(kind, dataset, data, tmp_path):
    out = tmp_path / "store"
    root, options = data.get(dataset, (None, {}))
    if dataset not in KINDS[kind].datasets:
        args = ["generate", kind, "--dataset", dataset, "--limit", "4", "--steps", "1", "--out", str(out)]
        args += ["--data-root", str(root)] if root else []
        assert_refused(args, f"{kind} cannot be made from --dataset {dataset}: it takes", out)
        return
    generate(GenerateOptions(kind=kind, out=str(out), dataset=dataset, data_root=root and str(root),
                             source_options=options or None, progress=False, **small(kind)), **QUIET)
    store = WeightStore(out)
    assert store.widths == KINDS[kind].widths and store.num_networks >= 4
    assert store.manifest["generation"]["dataset"] == dataset


def test_the_kind_table_names_only_known_datasets():
    for kind in KINDS.values():
        assert set(kind.datasets) <= set(SOURCES), kind.name
        assert set(kind.splits) == {"train", "val", "test"}


def test_an_unfinished_store_of_a_mismatch_is_refused_with_how_to_start_over(tmp_path):
    """Older versions created the store, then the fit crashed: every rerun must say to delete it."""
    out = tmp_path / "old"
    create_store(out, widths=(1, 32, 32, 1), num_networks=4, chunk_size=2,
                 splits={"train": {"start": 0, "count": 4, "items": 4}},
                 metadata={"kind": "sine-regression", "generation": {"kind": "sine-regression",
                                                                      "dataset": "mnist-offline"}})
    before = (out / "manifest.json").read_bytes()
    for dataset in (["--dataset", "mnist-offline"], []):  # the same command, or the right data set
        result = CliRunner().invoke(main, ["generate", "sine-regression", *dataset, "--out", str(out)])
        assert result.exit_code == 2, result.output
        assert "delete the folder" in result.output and "start over" in result.output, result.output
    assert (out / "manifest.json").read_bytes() == before


@pytest.mark.parametrize("options, message", [
    (["--workers", "2", "--no-ray"], "--workers 2 asks for Ray, --no-ray"),
    (["--address", "ray://127.0.0.1:1", "--no-ray"], "--address ray://127.0.0.1:1 asks for Ray, --no-ray"),
    (["--limit", "val=2,test=2"], "no train networks"),
    (["--limit", "train=2,holdout=2"], "unknown split"),
])
def test_conflicting_or_empty_options_are_refused_before_writing(tmp_path, options, message):
    out = tmp_path / "store"
    assert_refused(["generate", "sine-regression", "--steps", "1", "--out", str(out), *options], message, out)


def test_a_limit_list_keeps_none_of_the_splits_it_omits(tmp_path):
    out = tmp_path / "store"
    result = CliRunner().invoke(main, ["generate", "sine-regression", "--limit", "train=4,val=2", "--steps", "1",
                                       "--no-ray", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "warning: no test networks" in result.output
    assert {s: v["count"] for s, v in WeightStore(out).manifest["splits"].items()} == {"train": 4, "val": 2, "test": 0}
    runs = limited_counts(KINDS["fmnist-classifiers"].splits, {"train": 10, "val": 5})
    assert runs == {"train": 10, "val": 5, "test": 0}


def test_a_limit_n_keeps_the_paper_proportions():
    # the case: mnist-offline's files are 4,583 / 417 / 10,000; --limit 200 gave 61 / 5 / 134
    assert limited_counts({"train": 4583, "val": 417, "test": 10_000}, 200, PAPER_MNIST) == \
        {"train": 158, "val": 14, "test": 28}
    # a split with fewer items than its share keeps them all, the others share the rest
    assert limited_counts({"train": 3600, "val": 400, "test": 1000}, 4900, PAPER_MNIST) == \
        {"train": 3600, "val": 400, "test": 900}
    rng = np.random.default_rng(0)
    for _ in range(500):
        sizes = dict(zip(("train", "val", "test"), map(int, rng.integers(1, 2000, 3))))
        proportions = dict(zip(("train", "val", "test"), map(int, rng.integers(1, 2000, 3))))
        limit = int(rng.integers(3, sum(sizes.values()) + 10))
        counts = limited_counts(sizes, limit, proportions)
        assert sum(counts.values()) == min(limit, sum(sizes.values()))
        assert all(1 <= counts[s] <= sizes[s] for s in sizes), (sizes, proportions, limit, counts)
        # without proportions: the sizes' own, as before the paper proportions
        own = limited_counts(sizes, limit)
        if limit < sum(sizes.values()):
            assert all(own[s] >= int(sizes[s] * limit / sum(sizes.values())) for s in sizes)


def test_generate_warns_when_the_val_split_is_too_small_to_select_on(tmp_path):
    logs = []
    generate(GenerateOptions(kind="sine-regression", out=str(tmp_path / "s"), limit=40, steps=1, progress=False),
             log=logs.append)
    assert any("the val split has only 4 networks" in line for line in logs), logs  # 40 * 100 / 1000


def test_a_resume_whose_splits_the_command_no_longer_plans_is_refused(tmp_path):
    """A store an older version made with other --limit rules: refused, untouched."""
    out = tmp_path / "store"
    opts = GenerateOptions(kind="sine-regression", out=str(out), limit={"train": 4, "val": 2, "test": 2}, steps=1,
                           chunk_size=2, progress=False)
    generate(opts, **QUIET)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.update(status="in_progress", complete_chunks=[0])
    manifest["splits"]["train"]["count"], manifest["splits"]["val"]["start"] = 5, 5
    manifest["splits"]["val"]["count"] = 1
    write_manifest(out, manifest)  # with its checksum, as an older version's writer left it
    shutil.rmtree(out / "fragments")
    before = (out / "manifest.json").read_bytes()
    with pytest.raises(ValueError, match="train 5 / val 1 / test 2 networks, the same command now plans "
                                         "train 4 / val 2 / test 2"):
        generate(opts, **QUIET)
    assert (out / "manifest.json").read_bytes() == before
