"""The store format: round trip, plain-zarr/pyarrow decoding, and clear errors for bad stores."""

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import zarr

from zoo.inspect import decode
from zoo.store import DamagedStoreError, IncompleteStoreError, StoreError, StoreVersionError, WeightStore
from zoo.store.manifest import read_manifest, write_manifest


def test_round_trip_matches_fitted_rows(tiny_store):
    store = WeightStore(tiny_store)
    m = store.manifest
    assert m["status"] == "complete" and m["format_version"] == 2
    assert sum(s["count"] for s in m["splits"].values()) == store.num_networks == 60
    table = store.networks.to_pydict()
    assert table["index"] == list(range(60))
    # splits are contiguous blocks in train, val, test order
    for split, info in m["splits"].items():
        assert set(table["split"][info["start"]: info["start"] + info["count"]]) == {split}
    arrays = store.read(0, store.num_networks)
    for name, shape in m["parameters"].items():
        assert arrays[name].shape == (60, *shape) and np.isfinite(arrays[name]).all()
    # the stored PSNR is the PSNR of the stored parameters
    decoded = decode(store, range(5))
    assert decoded.shape == (5, 64, 1)


def test_read_rows_returns_any_networks_in_the_order_asked(tiny_store):
    """A subsample of a store larger than memory is read chunk by chunk; order and repeats are kept."""
    store = WeightStore(tiny_store)
    everything = store.read(0, store.num_networks)
    picks = np.random.default_rng(0).integers(0, store.num_networks, 3 * store.chunk_size)
    assert len(set(picks // store.chunk_size)) > 1  # the picks span chunks
    rows = store.read_rows(picks)
    for name, values in everything.items():
        np.testing.assert_array_equal(rows[name], values[picks])
    assert all(v.shape[0] == 0 for v in store.read_rows([]).values())
    with pytest.raises(IndexError, match="0..."):
        store.read_rows([store.num_networks])


def test_normalization_statistics_are_train_split_moments(tiny_store):
    store = WeightStore(tiny_store)
    start, stop = store.split_range("train")
    train = store.read(start, stop)
    for name, (mean, std) in store.stats().items():
        np.testing.assert_allclose(mean, train[name].astype(np.float64).mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(std, train[name].astype(np.float64).std(0), rtol=1e-4, atol=1e-6)


def test_decode_with_numpy_zarr_pyarrow_only(tiny_store):
    """What another lab does without our code: read manifest, arrays and table, rebuild an image."""
    manifest = json.loads((tiny_store / "manifest.json").read_text())
    group = zarr.open_group(str(tiny_store / manifest["arrays"]), mode="r")
    table = pq.read_table(tiny_store / "networks.parquet").to_pydict()
    arch = manifest["architecture"]
    h, w, c = manifest["source"]["image_shape"]
    ys, xs = np.meshgrid(np.linspace(-1, 1, h), np.linspace(-1, 1, w), indexing="ij")
    x = np.stack([ys, xs], -1).reshape(-1, 2).astype(np.float64)
    for i in [0, 17, 59]:
        act = x
        for m, w0 in enumerate(arch["w0_per_layer"], start=1):
            act = act @ group[f"W{m}"][i].T.astype(np.float64) + group[f"b{m}"][i]
            if w0 is not None:
                act = np.sin(w0 * act)
        act = act + arch["output_offset"]
        # the source image, re-read independently of the store (sklearn digits, pixel / 16)
        from sklearn.datasets import load_digits

        item = table["source_item"][i]
        split = table["split"][i]
        offset = 0 if split != "test" else 1500
        image = load_digits().images[offset + item].reshape(-1, 1) / 16.0
        mse = np.mean((act - image) ** 2)
        assert abs(10 * np.log10(1 / mse) - table["psnr"][i]) < 0.01
        assert table["label"][i] == load_digits().target[offset + item]


def _copy(tiny_store, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(tiny_store, dst)
    return dst


def test_newer_format_version_is_refused(tiny_store, tmp_path):
    root = _copy(tiny_store, tmp_path)
    m = read_manifest(root)
    m["format_version"] = 99
    write_manifest(root, m)
    with pytest.raises(StoreVersionError, match="v99"):
        WeightStore(root)


def test_incomplete_store_is_refused(tiny_store, tmp_path):
    root = _copy(tiny_store, tmp_path)
    m = read_manifest(root)
    m["status"] = "in_progress"
    m["complete_chunks"] = [0, 2]
    write_manifest(root, m)
    with pytest.raises(IncompleteStoreError, match="2 of 4 chunks missing"):
        WeightStore(root)


def test_array_disagreeing_with_manifest_is_refused(tiny_store, tmp_path):
    root = _copy(tiny_store, tmp_path)
    m = read_manifest(root)
    m["parameters"]["W2"] = [32, 31]
    write_manifest(root, m)
    with pytest.raises(StoreError, match="W2"):
        WeightStore(root)


def test_missing_or_corrupt_manifest_is_refused(tiny_store, tmp_path):
    root = _copy(tiny_store, tmp_path)
    (root / "manifest.json").write_text("{not json")
    with pytest.raises(StoreError, match="not valid JSON"):
        WeightStore(root)
    (root / "manifest.json").unlink()
    with pytest.raises(StoreError, match="not a weight store"):
        WeightStore(root)


def test_truncated_table_is_refused(tiny_store, tmp_path):
    root = _copy(tiny_store, tmp_path)
    table = pq.read_table(root / "networks.parquet")
    pq.write_table(table.slice(0, 10), root / "networks.parquet")
    with pytest.raises(DamagedStoreError, match="networks.parquet fails its crc32c checksum"):
        WeightStore(root).networks
    m = read_manifest(root)  # without the checksum (a store written before format v2): the row count
    del m["checksums"]["files"]["networks.parquet"]
    write_manifest(root, m)
    with pytest.raises(StoreError, match="10 rows"):
        WeightStore(root).networks


def test_writer_refuses_nan_parameters(tiny_store, tmp_path):
    from zoo.store.writer import write_chunk

    root = _copy(tiny_store, tmp_path)
    store = WeightStore(root)
    params = store.read_chunk(0)
    params["W2"][3, 0, 0] = np.nan
    rows = store.networks.slice(0, 16)
    with pytest.raises(StoreError, match="NaN"):
        write_chunk(root, 0, params, rows)
    assert np.isfinite(WeightStore(root).read_chunk(0)["W2"]).all()  # nothing was overwritten


def test_stored_inrs_load_into_siren_pytorch(tiny_store):
    """Every convention the manifest states is enough to rebuild the networks in siren-pytorch."""
    siren_pytorch = pytest.importorskip("siren_pytorch")
    import torch

    store = WeightStore(tiny_store)
    arch = store.manifest["architecture"]
    assert arch["siren_pytorch"]["exact"]
    indices = [0, 23, 59]
    expected = decode(store, indices)
    h, w, _ = store.manifest["source"]["image_shape"]
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
    coords = torch.stack([yy, xx], -1).reshape(-1, 2)
    for k, i in enumerate(indices):
        net = siren_pytorch.SirenNet(**arch["siren_pytorch"]["kwargs"])
        params = store.read(i, i + 1)
        with torch.no_grad():
            for m, layer in enumerate(list(net.layers) + [net.last_layer], start=1):
                layer.weight.copy_(torch.from_numpy(params[f"W{m}"][0]))
                layer.bias.copy_(torch.from_numpy(params[f"b{m}"][0]))
            np.testing.assert_allclose(net(coords).numpy() + arch["output_offset"], expected[k], atol=1e-4)


def test_a_store_smaller_than_a_chunk_is_not_padded(tmp_path):
    """Zarr writes edge chunks whole: 5 networks in chunks of 1,024 would take 4.7 MiB on disk."""
    from zoo.generate.run import GenerateOptions, generate

    out = tmp_path / "small"
    opts = GenerateOptions(kind="mnist-inr", out=str(out), dataset="digits", limit=5, steps=3, chunk_size=1024)
    generate(opts, log=lambda *_: None)
    store = WeightStore(out)
    assert store.manifest["chunk_size"] == 5 and store.manifest["num_chunks"] == 1
    assert store.manifest["generation"]["chunk_size"] == 1024  # what was asked, for resuming
    assert sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) < 512 * 1024
    assert np.isfinite(store.read(0, 5)["W2"]).all()
    logs = []
    generate(opts, log=logs.append)  # the same command again: complete, nothing refitted
    assert "already complete" in logs[0]


def test_the_table_records_which_fitting_step_fitted_each_network(tiny_store, tmp_path):
    from zoo.fit import native
    from zoo.fit.fitter import STEP_IMPLEMENTATIONS
    from zoo.store.writer import consolidate_rows, fragment_name

    table = WeightStore(tiny_store).networks
    assert set(table.column("fit_step").to_pylist()) <= set(STEP_IMPLEMENTATIONS)
    if native.available():
        assert set(table.column("fit_step").to_pylist()) == {"native-c"}
    # a fragment from before the column (a store resumed across versions) still consolidates
    copy = tmp_path / "copy"
    shutil.copytree(tiny_store, copy)
    manifest = read_manifest(copy)
    old = copy / fragment_name(0)
    pq.write_table(pq.read_table(old).drop_columns(["fit_step"]), old)
    del manifest["checksums"]["files"][fragment_name(0)]  # written before checksums were recorded
    merged = consolidate_rows(copy, manifest)
    first = manifest["chunk_size"]
    assert merged.column("fit_step").null_count == first
    from zoo.inspect.inrs import _fitted_by

    assert f"unrecorded ({first})" in _fitted_by(merged)  # what `zoo info` prints for a mixed store
    assert merged.num_rows == manifest["num_networks"]
