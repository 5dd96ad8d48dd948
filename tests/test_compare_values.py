"""``zoo compare --values``: whether two stores hold the same networks when their files cannot be matched
by checksum (chunked differently, exported to another layout and imported back)."""

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zarr
from click.testing import CliRunner

import cli
from zoo.exchange import export_zoo, import_zoo
from zoo.store import compare_values as by_value
from zoo.store.compare_values import compare_values
from zoo.store.manifest import read_manifest


@pytest.fixture(scope="module")
def reimported(tiny_store, tmp_path_factory):
    """``tiny_store`` exported to nfn's layout and imported back, in chunks of 5 networks, not 16 (nfn's SIREN
    is this store's function; DWSNets' adds 0.5 to the output, so its export moves that into the last bias)."""
    root = tmp_path_factory.mktemp("reimported")
    export_zoo(tiny_store, "nfn-siren", root / "exported", progress=False)
    manifest = read_manifest(tiny_store)
    split_points = tuple(manifest["splits"][s]["start"] for s in ("val", "test"))
    return import_zoo("nfn-siren", root / "exported", root / "store", chunk_size=5, split_points=split_points,
                      progress=False)


def _copy(store, tmp_path, name="copy"):
    return shutil.copytree(store, tmp_path / name)


def _bump(store, name, index, factor=None):
    """One value a float32 step up (or times ``factor``)."""
    array = zarr.open_group(str(store / "arrays"), mode="r+")[name]
    value = array[index]
    array[index] = (value * factor if factor else np.nextafter(value, np.float32(np.inf))).astype(value.dtype)


def test_an_export_imported_back_is_the_same_networks_though_no_checksum_matches(tiny_store, reimported, tmp_path):
    assert read_manifest(reimported)["chunk_size"] != read_manifest(tiny_store)["chunk_size"]
    runner = CliRunner()
    by_checksum = runner.invoke(cli.main, ["compare", str(tiny_store), str(reimported)])
    assert by_checksum.exit_code == 1
    assert "checksums cannot tell whether the networks differ" in by_checksum.output
    assert "the networks differ)" not in by_checksum.output
    record = tmp_path / "record.json"  # a record does not say its chunk size: the files on one side only do
    record.write_text(runner.invoke(cli.main, ["checksums", str(tiny_store)]).output)
    from_record = runner.invoke(cli.main, ["compare", str(record), str(reimported)])
    assert from_record.exit_code == 1 and "or are cut into chunks differently" in from_record.output
    result = runner.invoke(cli.main, ["compare", str(tiny_store), str(reimported), "--values"])
    assert result.exit_code == 0, result.output
    assert "parameters  equal: every value of the" in result.output and "the same networks" in result.output
    found = compare_values(tiny_store, reimported)
    assert found.same_networks and not found.differing and not found.statistics_differ
    assert 0 < found.statistics_rounding < 1e-6  # float64 sums in another chunk order
    assert "init_ranges" in found.provenance and not found.mismatches  # how they were made: not knowable on import
    assert "source_file" in found.columns_only_b and {"index", "split", "label"} <= set(found.columns_equal)
    itself = compare_values(tiny_store, tiny_store)  # its INRs' amplitude and frequency are NaN: equal to NaN
    assert np.isnan(pq.read_table(tiny_store / "networks.parquet").column("amplitude").to_numpy()).all()
    assert not itself.columns_differ and itself.statistics_rounding == 0 and itself.same_networks


@pytest.mark.parametrize("window_bytes", [1, 3000, 1 << 30])  # one network a window, windows across chunks, all
def test_one_changed_weight_is_named_by_network_and_parameter(tiny_store, reimported, tmp_path, monkeypatch,
                                                             window_bytes):
    monkeypatch.setattr(by_value, "WINDOW_BYTES", window_bytes)
    changed = _copy(reimported, tmp_path)
    rng = np.random.default_rng(window_bytes)
    network = int(rng.integers(read_manifest(changed)["num_networks"]))
    _bump(changed, "W2", (network, 3, 5))
    found = compare_values(tiny_store, changed)
    assert not found.same_networks
    assert list(found.differing) == ["W2"] and found.differing["W2"].tolist() == [network]
    assert 0 < found.largest["W2"] < 1e-5
    result = CliRunner().invoke(cli.main, ["compare", str(tiny_store), str(changed), "--values"])
    assert result.exit_code == 1
    assert f"1 of {found.networks} networks differ: networks {network}" in result.output
    assert "different networks" in result.output


def test_statistics_and_a_target_column_count_and_other_columns_do_not(tiny_store, reimported, tmp_path):
    from generate_helpers import replace_networks_table

    stats = _copy(reimported, tmp_path, "stats")
    _bump(stats, "stats/b1_std", (2,), factor=1.001)
    found = compare_values(tiny_store, stats)
    assert found.statistics_differ == ["b1_std"] and not found.differing and not found.same_networks

    for column, same in (("source_file", True), ("label", False)):
        other = _copy(reimported, tmp_path, f"table-{column}")
        table = pq.read_table(other / "networks.parquet")
        values = table.column(column).to_pylist()
        changed = [values[1], values[0], *values[2:]] if column == "label" else [f"x/{v}" for v in values]
        assert changed != values
        replace_networks_table(other, table.set_column(table.column_names.index(column), column, pa.array(changed)))
        found = compare_values(reimported, other)
        assert found.columns_differ == [column] and found.same_networks is same
        if not same:
            assert "columns a training reads: label" in found.summary()


def test_what_the_networks_are_is_compared_before_their_values(tiny_store, reimported, tmp_path):
    from zoo.store.manifest import write_manifest

    fewer = _copy(reimported, tmp_path, "splits")
    manifest = read_manifest(fewer)
    manifest["splits"]["val"]["count"] -= 1
    manifest["splits"]["test"]["start"] -= 1
    manifest["splits"]["test"]["count"] += 1
    write_manifest(fewer, manifest)
    found = compare_values(tiny_store, fewer)
    assert not found.same_networks and any(m.startswith("splits differ") for m in found.mismatches)
    assert not found.differing  # the same values, in other splits

    other = _copy(reimported, tmp_path, "function")
    manifest = read_manifest(other)
    manifest["architecture"]["w0_first"] = 1.0
    write_manifest(other, manifest)
    found = compare_values(tiny_store, other)
    assert found.mismatches == ["architecture differs in w0_first"] and not found.same_networks


def test_a_checksum_record_is_refused_with_values_in_one_line(tiny_store, tmp_path):
    record = tmp_path / "record.json"
    record.write_text(CliRunner().invoke(cli.main, ["checksums", str(tiny_store)]).output)
    result = CliRunner().invoke(cli.main, ["compare", str(tiny_store), str(record), "--values"])
    assert result.exit_code == 2 and "a checksum record" in result.output and "Traceback" not in result.output


def test_windows_stay_inside_every_sides_chunks_and_each_chunk_is_decoded_once(tiny_store, reimported, monkeypatch):
    rng = np.random.default_rng(7)
    for _ in range(50):
        networks, most = int(rng.integers(1, 200)), int(rng.integers(1, 40))
        sizes = tuple(int(v) for v in rng.integers(1, 50, size=2))
        spans = list(by_value.windows(networks, sizes, most))
        assert [lo for lo, _ in spans] == [0, *(hi for _, hi in spans[:-1])] and spans[-1][1] == networks
        for lo, hi in spans:
            assert 0 < hi - lo <= most and all(lo // size == (hi - 1) // size for size in sizes)
    from zoo.store.reader import WeightStore

    decoded = []
    real = WeightStore.read_chunk
    monkeypatch.setattr(WeightStore, "read_chunk",
                        lambda self, c: decoded.append((self.chunk_size, c)) or real(self, c))
    monkeypatch.setattr(by_value, "WINDOW_BYTES", 3000)  # several windows a chunk
    assert compare_values(tiny_store, reimported).same_networks
    assert sorted(decoded) == sorted({*decoded}) and len(decoded) == 4 + 12  # 60 networks: chunks of 16 and of 5
